"""The live processes of this machine, as the tests see them from outside any namespace."""

from __future__ import annotations

from pathlib import Path


def running_with(marker: bytes) -> list[int]:
    """Host pids of the live processes (a zombie waiting to be reaped is not one) whose command line
    (``\\0``-separated) holds ``marker``: a pid an agent wrote down may be one of its own PID
    namespace, so the tests find its processes by their command lines instead."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found
