"""What the test process has open: the targets of its descriptors (``/proc/self/fd``)."""

from __future__ import annotations

import os


def open_targets() -> list[str]:
    """Each open descriptor's target: a path, ``socket:[inode]``, ``pipe:[inode]``, ``anon_inode:...``."""
    targets = []
    for name in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue  # (the listing's own descriptor, closed by now)
    return targets
