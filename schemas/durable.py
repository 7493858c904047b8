"""Durable writes: after a crash or a power loss a file holds its old bytes or all of its new ones,
and a caller goes on (removes what the file replaces, says it is done) only once the new name
itself is on disk."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make the names in ``directory`` durable (a rename, a new file, a removal)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` (all of it, on disk) on return; its old contents until then."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(aside, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(aside, path)
    except BaseException:
        aside.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


SMALL_FILE_MAX = 256 << 20
"""The most ``read_small`` reads: a state or plan file larger than this is not one amb wrote."""


def open_regular(path: Path, follow_links: bool = True) -> int:
    """A descriptor of ``path`` opened for reading, which must be a regular file: a FIFO, a device,
    a folder (or, unless ``follow_links``, any symbolic link) raises ``OSError`` at once, never an
    open or a read that blocks or never ends (files in a folder others can write)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise OSError(errno.ELOOP, "a symbolic link, not a file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def read_small(path: Path, limit: int = SMALL_FILE_MAX) -> bytes:
    """The bytes of a state file that others may have touched (a sweep's shared directory): a
    regular file, not a link to one (``open_regular``), and ``OSError`` if larger than ``limit``."""
    with os.fdopen(open_regular(path, follow_links=False), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data
