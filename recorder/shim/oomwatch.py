"""Notice the kernel's OOM killer at work in the shim's own memory cgroup (the container's).

The shim shares the agent's memory limit, and the OOM killer is as likely to take it as any of the
agent's processes; exempting it (``oom_score_adj`` -1000) takes CAP_SYS_RESOURCE, which container
hosts do not always grant. So the first OOM kill ends the run, the same way whichever process was
taken (docs/containers.md). The kernel counts the kills per cgroup (``oom_kill`` in
``memory.events``, v2, or ``memory.oom_control``, v1); the count is polled every ``POLL_S`` seconds
on a thread started before the agent (a thread needs a pid, and the agent may take them all).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
"""Where the container's OOM kill count is, under cgroup v2 and v1."""

POLL_S = 0.05


def oom_kills(path: str) -> int | None:
    """The ``oom_kill`` count in a cgroup's ``memory.events`` or ``memory.oom_control``."""
    try:
        with open(path, "rb") as f:
            for line in f:
                key, _, value = line.partition(b" ")
                if key == b"oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


class OomWatch:
    """Calls ``on_kill`` once, from its own thread, when the cgroup's OOM kill count goes up."""

    def __init__(self, on_kill: Callable[[], None], counters: tuple[str, ...] = COUNTERS):
        self.on_kill = on_kill
        self.path = next((p for p in counters if oom_kills(p) is not None), None)
        """The counter in use; None where there is none (outside a memory cgroup): nothing to watch."""
        self.kills = 0
        """OOM kills seen since the watch started."""
        self._base = oom_kills(self.path) if self.path else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="amb-shim-oom", daemon=True)

    def start(self) -> OomWatch:
        if self.path is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._check()  # a kill in the last moments is counted too

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            if self._check():
                return

    def _check(self) -> bool:
        now = oom_kills(self.path) if self.path is not None else None
        if now is None or self._base is None or now <= self._base:
            return False
        first = self.kills == 0
        self.kills = now - self._base
        if first:
            self.on_kill()
        return True
