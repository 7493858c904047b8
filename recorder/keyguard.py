"""Key custody on this machine: the processes that hold a real API key are closed to the agent.

``guard_this_process`` marks amb-record non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): an agent of the
same user can then neither read its ``/proc/<pid>/environ`` or ``mem`` nor trace it (docs/recording.md,
"Credentials"). The flag lasts until the process execs, which amb-record never does; its
``/proc/<pid>/cmdline`` stays readable, so a key is never put on a command line. Other processes that
hold the key are hidden by ``recorder.isolation``; where they cannot be, ``exposures`` names them.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def _prctl(option: int, arg: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, arg, 0, 0, 0))


def guard_this_process() -> bool:
    """Make this process non-dumpable; True if it now is (Linux), False where that is not possible."""
    try:
        _prctl(PR_SET_DUMPABLE, 0)
        return _prctl(PR_GET_DUMPABLE, 0) == 0
    except (OSError, AttributeError):
        return False


def exposures(keys: list[str]) -> list[str]:
    """Other processes whose environment this user can read and which hold one of ``keys``:
    ``"1234 (bash)"``. An agent running as this user could read them too."""
    needles = [k.encode() for k in keys if k]
    if not needles:
        return []
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, someone else's, or guarded
        if any(n in env for n in needles):
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                comm = "?"
            found.append(f"{entry.name} ({comm})")
    return found


def local_warning(keys: list[str], guarded: bool, *, isolated: bool = False) -> str:
    """What amb-record says at the start of a local run that holds real keys: what stays open.
    ``isolated``: the agent runs in namespaces of its own (``recorder.isolation``) and cannot see
    the user's other processes."""
    if os.geteuid() == 0:
        return (
            "the local agent runs as root, like amb-record, and root can read the real key from "
            "amb-record's memory; use --backend docker (the agent runs as an unprivileged user there)"
        )
    closed = "amb-record's environment and memory are closed to it"
    if not guarded:
        closed = "this system does not let amb-record close its own environment and memory to it"
    if isolated:
        return (
            "the local agent runs as your user: your other processes are hidden from it, but it can "
            f"read the real key in any file your user can (a shell rc file, a .env); {closed}. "
            "Use --backend docker to keep the key out of its reach"
        )
    held = exposures(keys)
    where = f"; processes of yours that hold it now: {', '.join(held[:5])}" if held else ""
    return (
        "the local agent runs as your user: it can read the real key wherever your user can (files "
        f"such as a shell rc file or .env, your other processes' environments{where}); {closed}. "
        "Use --backend docker to keep the key out of its reach"
    )
