"""Reading a submitted text file safely: regular files only, size-capped, UTF-8.

Every grader that reads agent-written text (answers, reports) goes through here, so none of them
can be made to hang on a FIFO or a device, or to read a huge file into memory. JSON an agent wrote
is measured for nesting before a decoder sees it (``check_json_depth``).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from pathlib import Path
from typing import Any, BinaryIO

from scorer.grader.submitted import Rejected, open_submitted

MAX_JSON_DEPTH = 64
"""Arrays and objects nested deeper than this are refused (a prediction or an answer is 2-3 deep)."""

_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
"""A JSON string, escapes included, or an unterminated one to the end of the input: possessive, and
every quote starts a match that succeeds, so the blanking is linear whatever the input."""
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


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
    """Like ``read_text`` for a file of a submission: opened only if it is a regular file that lives
    inside ``submission`` (``scorer.grader.submitted``). A refusal is ``UnreadableText`` too; a file
    that is not there at all is ``Rejected`` with kind ``missing``."""
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


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of arrays and objects in a JSON document, found without recursion: its
    strings blanked, then a running count of brackets. Exact for valid JSON; for invalid JSON, at
    least the depth a decoder reaches before the first error (both read strings the same way)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    brackets = _JSON_STRING.sub(b'""', data).translate(None, _NOT_BRACKETS)
    return max(accumulate((_STEP[b] for b in brackets), initial=0))


def check_json_depth(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> None:
    """``ValueError`` when ``raw`` nests deeper than ``limit``. Decoders (json, msgspec) recurse once
    per level up to Python's recursion limit: a hostile file 100,000 levels deep would take the stack
    to its end, where any code that runs meanwhile (a garbage collection's finalizers) fails too."""
    depth = json_depth(raw)
    if depth > limit:
        raise ValueError(f"nested {depth} levels deep; at most {limit} are accepted")


def loads_untrusted(raw: bytes | str) -> Any:
    """``json.loads`` of text an agent or a model wrote: ``ValueError`` for anything that is not JSON
    or nests deeper than ``MAX_JSON_DEPTH``, never a ``RecursionError``."""
    check_json_depth(raw)
    return json.loads(raw)
