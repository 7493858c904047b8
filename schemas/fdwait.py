"""Waiting for a descriptor to become readable, by poll rather than select.

``select.select`` refuses a descriptor numbered past 1,023, and a process holding many open files
(a long-lived server, the recorder or scorer run inside a test session) hands out such numbers.
"""

from __future__ import annotations

import select


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has something to read, or its end, within ``timeout`` seconds."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))
