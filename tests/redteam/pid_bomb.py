"""The fork bomb of the hostile agents (``hostile_agent.py``, ``exhaust_agent.py``), copied beside them
into ``/data/public``: threads until the kernel refuses one. Threads are tasks as forks are, and the
pids limit counts both; threads make the bomb take a second, not minutes of copying a Python process."""

import threading
import time


def take_every_pid(
    most: int = 20000, seconds: float = 20.0
) -> tuple[threading.Event, list[threading.Thread], str | None]:
    """Start threads until one is refused (or ``most`` run, or ``seconds`` passed); each waits on the
    returned event. Returns it, the threads, and the refusal (None: none came)."""
    threading.stack_size(64 * 1024)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    t0 = time.monotonic()
    while len(threads) < most and time.monotonic() - t0 < seconds:
        t = threading.Thread(target=stop.wait, daemon=True)
        try:
            t.start()
        except RuntimeError as e:
            return stop, threads, str(e)
        threads.append(t)
    return stop, threads, None
