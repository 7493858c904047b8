"""Durable writes: after a crash or a power loss a file holds its old bytes or all of its new ones,
and a caller goes on (removes what the file replaces, says it is done) only once the new name
itself is on disk."""

from __future__ import annotations

import os
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
