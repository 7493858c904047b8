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


def read_small(path: Path, limit: int = SMALL_FILE_MAX) -> bytes:
    """The bytes of a state file that others may have touched (a sweep's shared directory).

    It must be a regular file, not a link to one: a FIFO, a device or a link raises ``OSError``
    at once (never a read that blocks or never ends), and so does one larger than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, not a file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1) if st.st_size <= limit else b""
        if st.st_size > limit or len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        return data
    finally:
        os.close(fd)
