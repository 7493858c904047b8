"""Reading a submitted text file safely (regular files only, size-capped, UTF-8), so no grader can be
made to hang on a FIFO or a device, or to read a huge file into memory."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from scorer.grader.submitted import Rejected, open_submitted


class UnreadableText(Exception):
    """Why a file cannot be read as text; the message is written to stand as a case's reason."""


def read_text(path: Path, limit: int, too_long: str | None = None) -> str:
    """The UTF-8 text of ``path``, at most ``limit`` bytes, or ``UnreadableText`` saying why not."""
    if not path.is_file():
        raise UnreadableText("not a regular file")
    try:
        with open(path, "rb") as f:
            return read_text_from(f, limit, too_long)
    except OSError as e:
        raise UnreadableText(f"cannot read: {e.strerror or e}") from e


def read_submitted_text(submission: Path, rel: str, limit: int, too_long: str | None = None) -> str:
    """``read_text`` of a file inside ``submission``, opened by ``open_submitted``: a refusal is
    ``UnreadableText`` too; a file that is not there at all is ``Rejected`` with kind ``missing``."""
    try:
        f = open_submitted(submission, rel)
    except Rejected as e:
        if e.kind == "missing":
            raise
        raise UnreadableText(str(e)) from e
    try:
        with f:
            return read_text_from(f, limit, too_long)
    except OSError as e:
        raise UnreadableText(f"cannot read: {e.strerror or e}") from e


def read_text_from(f: BinaryIO, limit: int, too_long: str | None = None) -> str:
    """The UTF-8 text of an open file, at most ``limit`` bytes, or ``UnreadableText``."""
    raw = f.read(limit + 1)
    if len(raw) > limit:
        raise UnreadableText(too_long or f"larger than {limit} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableText(f"not UTF-8 (byte {e.start})") from e
