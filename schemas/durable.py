"""Durable writes: a file's new bytes are either all on disk under its name, or its old state is.

``write_durably`` writes beside the target (a hidden name of this process's), fsyncs that file,
renames it over the target and fsyncs the directory, so a crash or a power loss leaves the old file
or the new one, never a part of either, and a caller that goes on (to remove what the file replaces,
to say it is done) does so only once the new name itself is on disk. ``fsync_dir`` is the last step
alone, for callers that rename or remove files themselves.
"""

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
