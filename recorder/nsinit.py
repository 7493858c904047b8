"""PID 1 of a local agent's own PID namespace (``recorder.isolation`` starts it there).

    python -I nsinit.py STATUS_FD -- ARGV...

An init of amb's own rather than the agent as PID 1: the kernel gives a namespace's first process
no default signal actions (a SIGTERM at the time limit would be dropped), and every orphan of the
namespace becomes its child, to be reaped. It starts the agent as its child, in the process group
amb-record signals, reaps orphans, and reports on STATUS_FD (a pipe to amb-record): ``started``;
``error ERRNO`` when the agent could not be started (``2``: command not found); ``exit CODE`` or
``signal N`` when it ended (an init cannot die of a signal, so only this line tells ``exit 137``
from a SIGKILL). Then the kernel kills whatever the agent left in the namespace. It runs with ``-I``
and imports only the standard library: the agent's environment cannot change what it runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
"""Blocked by amb-record while ``unshare`` starts (so that ``unshare`` outlives a forwarded signal
and stays to report the init's end); unblocked here so the agent starts with the usual mask."""


def _non_dumpable() -> None:
    # The agent runs as the same user: without this it could ptrace its init (no Yama needed),
    # make it report a false end, or keep the namespace alive after the agent's end.
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def main(argv: list[str]) -> int:
    status_fd = int(argv[0])
    command = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    # Python installed its own SIGINT handler at start: as PID 1 that handler would make the init
    # receive the SIGINT amb-record forwards to the agent's group. Default actions are ignored here.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _non_dumpable()
    os.set_inheritable(status_fd, False)

    def say(line: str) -> None:
        with contextlib.suppress(OSError):  # amb-record is gone: the kernel ends this namespace with it
            os.write(status_fd, line.encode() + b"\n")

    try:
        agent = subprocess.Popen(command)
    except OSError as e:
        say(f"error {e.errno or 0}")
        return 127
    say("started")
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # cannot happen while the agent is unreaped; never spin
            say("exit 1")
            return 1
        if pid == agent.pid:
            break
    if os.WIFSIGNALED(status):
        say(f"signal {os.WTERMSIG(status)}")
        return 128 + os.WTERMSIG(status)
    code = os.waitstatus_to_exitcode(status)
    say(f"exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
