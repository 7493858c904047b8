"""Reading a submitted text file safely: regular files only, size-capped, UTF-8.

Every grader that reads agent-written text (answers, reports) goes through here, so none of them
can be made to hang on a FIFO or a device, or to read a huge file into memory.
"""

from __future__ import annotations

from pathlib import Path


class UnreadableText(Exception):
    """Why a file cannot be read as text; the message is written to stand as a case's reason."""


def read_text(path: Path, limit: int, too_long: str | None = None) -> str:
    """The UTF-8 text of ``path``, at most ``limit`` bytes, or ``UnreadableText`` saying why not."""
    if not path.is_file():
        raise UnreadableText("not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise UnreadableText(f"cannot read: {e.strerror or e}") from e
    if len(raw) > limit:
        raise UnreadableText(too_long or f"larger than {limit} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableText(f"not UTF-8 (byte {e.start})") from e
