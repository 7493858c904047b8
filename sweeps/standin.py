"""``python -m sweeps.standin -- CMD...``: a process that stands between an engine's worker and an exec.

An exec must end by SIGTERM, never by SIGKILL: SIGTERM makes it stop its container and close its
run; SIGKILL leaves the container running unwatched and the run unclosed. Some engines SIGKILL
whatever their worker started: Ray kills a worker's direct child processes when the worker exits
(``RAY_kill_child_processes_on_worker_exit``, on by default), and a worker exits as soon as the
task's owner dies, e.g. a Ray Job's driver, which ``ray job stop`` SIGKILLs 3 s after its SIGTERM.

So the worker's direct child is this stand-in, not the exec. It starts the exec in a session of its
own (out of reach of a kill aimed at the worker's process group) with SIGTERM as its parent-death
signal, forwards every stop signal to it and exits with its status. Killed with SIGKILL, the
stand-in dies alone, and the kernel sends the exec SIGTERM.

Only the standard library: the stand-in starts before every run and should start fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def term_with_parent() -> None:
    """Ask the kernel to send this process SIGTERM when its parent dies (Linux; a no-op elsewhere):
    an exec whose starter is killed, even with kill -9, still stops its container and closes its run."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def command(argv: Sequence[str]) -> list[str]:
    """``argv`` run behind a stand-in, by this Python (``-P``: not a ``sweeps`` package of the
    folder it starts in)."""
    return [sys.executable, "-P", "-m", "sweeps.standin", "--", *argv]


def run(argv: Sequence[str]) -> int:
    """Run ``argv`` as described above; returns its exit status (128 + N when signal N ended it)."""
    child: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            child[0].send_signal(signum)
        else:  # arrived before the exec existed: it gets it as soon as it does
            pending.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, forward)
    term_with_parent()  # the stand-in's own parent (the worker) dies: forward SIGTERM too
    if os.getppid() == 1:  # the worker died before the line above: nothing is left to stand in for
        return 128 + signal.SIGTERM
    try:
        child.append(subprocess.Popen(list(argv), start_new_session=True, preexec_fn=term_with_parent))
    except OSError as e:
        print(f"amb sweep stand-in: cannot run {argv[0]}: {e}", file=sys.stderr, flush=True)
        return 127
    for signum in pending:
        child[0].send_signal(signum)
    code = child[0].wait()  # a forwarded signal interrupts the wait, which then resumes
    return 128 - code if code < 0 else code


def main(args: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m sweeps.standin -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
