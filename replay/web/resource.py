"""What every resource of the viewer's API shares: its errors, typed query parameters, keyset
cursors, event keys, and the route table's patterns (docs/viewer.md lists the API).

Nanosecond timestamps do not fit a JavaScript number, so they travel as strings (``ts_ns``) beside
milliseconds from the run's start (``t_ms``). Paging is by keyset, never by offset: a page carries
an opaque cursor naming its edge row's sort key, and the next page is "the rows after that key".
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import duckdb
import msgspec

from replay.store import first
from schemas.display import clip
from schemas.errors import AmbError
from schemas.untrusted_json import loads_untrusted


class NotFound(AmbError):
    """The thing asked for is not in the store (HTTP 404)."""


class BadRequest(AmbError):
    """A parameter the API cannot use (HTTP 400)."""


SUMMARY_CHARS = 200
PAGE_MAX = 500
TEXT_CAP = 20_000
"""Characters of one message's text sent on expand; the raw bytes tab has the rest."""
RAW_CAP = 64 * 1024
"""Bytes of a raw request or response body sent inline; the whole body is a blob download."""
IMAGE_CAP = 8 * 1024 * 1024
"""Largest image the viewer serves for display (bigger ones are downloads)."""

Limit = Annotated[int, msgspec.Meta(ge=1, le=PAGE_MAX)]
Seq = Annotated[int, msgspec.Meta(ge=0)]
Millis = Annotated[float, msgspec.Meta(ge=-1e12, le=1e12)]
"""Milliseconds from a run's start: finite, within about 30 years either way."""
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
"""A score's bound: 0 to 1. NaN (which compares false with every score) and infinities are refused."""


class Query(msgspec.Struct, frozen=True):
    """Query parameters of a route; fields the route does not name are ignored."""


Q = TypeVar("Q", bound=Query)


def parse_query(params: dict[str, str], kind: type[Q]) -> Q:
    """``params`` as ``kind``: numbers read from their text, an empty value taken as absent."""
    try:
        return msgspec.convert({k: v for k, v in params.items() if v != ""}, kind, strict=False)
    except msgspec.ValidationError as e:
        raise BadRequest(f"bad parameter: {e}") from None


BLOB_CSP = "default-src 'none'; sandbox"
"""Bytes an agent wrote are never a page: no script, no style, a sandbox of their own."""


@dataclass
class Body:
    """An answer that is not JSON: bytes, their type and extra headers; sent under ``BLOB_CSP``."""

    data: bytes
    media_type: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    """``pattern``: the path's segments after ``/api/``; ``{name}`` takes one segment, ``{name:int}``
    a whole number. ``handler`` answers with the Struct ``answer`` (sent as JSON) or a ``Body``."""

    pattern: str
    handler: Callable[..., Any]
    answer: type
    query: type[Query] = Query

    def match(self, parts: list[str]) -> dict[str, Any] | None:
        """The path's arguments when its shape is this route's (a number that is none: 400)."""
        wants = self.pattern.split("/")
        if len(wants) != len(parts):
            return None
        if any(not w.startswith("{") and w != got for w, got in zip(wants, parts, strict=True)):
            return None
        args: dict[str, Any] = {}
        for want, got in zip(wants, parts, strict=True):
            if want.endswith(":int}"):
                args[want[1:-5]] = whole_number(got, want[1:-5].upper())
            elif want.startswith("{"):
                args[want[1:-1]] = got
        return args


MAX_DIGITS = 18
"""The longest whole number a path or key carries: every one of them fits a BIGINT."""


def whole_number(text: str, what: str) -> int:
    """``text`` as a whole number: ASCII digits only. ``str.isdigit`` also takes '²', which ``int``
    refuses, and '١', which ``int`` reads as 1 (another event than the one linked)."""
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_DIGITS:
        raise BadRequest(f"bad {what} {text[:40]!r}: expected a whole number in ASCII digits (at most 18)")
    return int(text)


def one_line(text: str | None, n: int = SUMMARY_CHARS) -> str:
    return clip((text or "").replace("\n", " ⏎ "), n)


def encode_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(text: str) -> Any:
    try:
        return loads_untrusted(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error) as e:
        raise BadRequest(f"bad cursor {text[:40]!r}: {e}") from None


def parse_key(text: str) -> tuple[str, int]:
    """``SOURCE:SEQ`` (the deep-link form, also what scores cite) into its parts."""
    source, sep, seq = text.rpartition(":")
    if not sep or not source:
        raise BadRequest(f"bad event key {text[:60]!r}: expected SOURCE:SEQ")
    return source, whole_number(seq, f"event key {text[:60]!r}: SEQ")


def has_scores(con: duckdb.DuckDBPyConnection, view: str = "scores_current") -> bool:
    """Whether the store has the scorer's ``view`` (``scan_results_current``: it was ever scanned)."""
    row = first(con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [view]))
    return bool(row and row[0])
