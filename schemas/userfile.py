"""A small file a user names by path (a scoring profile, a price table, a manifest), read with one
clear error whatever the path is: too long a name, a directory, a device, /proc/self/mem, bytes
that are not UTF-8, or far more than such a file holds."""

from __future__ import annotations

from pathlib import Path

from schemas.errors import BadInput, quoted

MAX_BYTES = 16 << 20
"""More than any profile, price table or manifest holds; a bigger file is not one of them."""


def is_file(path: Path) -> bool:
    """Whether ``path`` is a regular file; False for a name the file system cannot even look up."""
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a loop of links, a NUL byte
        return False


def read_text(path: Path, what: str) -> str:
    """The file's text (UTF-8); ``BadInput`` naming ``what`` and the path if it cannot be had."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except (OSError, ValueError) as e:
        raise BadInput(
            f"{what} {quoted(str(path))}: cannot read: {getattr(e, 'strerror', None) or e}"
        ) from None
    if len(data) > MAX_BYTES:
        raise BadInput(f"{what} {quoted(str(path))}: larger than {MAX_BYTES >> 20} MB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{what} {quoted(str(path))}: not UTF-8 text ({e.reason} at byte {e.start})") from None
