"""Foreign values checked before they become facts: counts, durations, times and text.

What an importer keeps ends up in a hash-chained event that is never rewritten, so every value is
checked where it is read, and one that cannot be a fact refuses the whole input (``Rejected``) with
one line naming the file (``shown``), the step or line, the field and the value. Guessing a
replacement would put a number into the store that nobody recorded.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from datetime import UTC, datetime
from typing import Any

from schemas.display import for_message
from schemas.errors import AmbError, quoted

TS_MAX = (1 << 63) - 1
"""The latest time an event can carry: nanoseconds since 1970 in a signed 64-bit integer
(2262-04-11); times before 1970 are refused too (no run was recorded then)."""

COUNT_MAX = (1 << 53) - 1
"""The largest count (tokens, retries) an import accepts: every JSON reader, JavaScript's among
them, holds it exactly, and the sums the scorer takes over many calls stay within 64 bits."""

SECONDS_MAX = 100 * 365 * 86400.0
"""The longest duration an import accepts (a century; more is a unit mistake, not a run)."""

OUTSIDE = "is outside the times a run can hold (1970-01-01 to 2262-04-11)"
NOT_UNICODE = "text that is not Unicode (a lone surrogate)"

_NAME_MAX = 4096
"""Characters of a file's name a message shows (PATH_MAX: a longer name names no file)."""


class Rejected(AmbError):
    """An input that cannot be imported; the message names the file and the reason."""


def shown(path: str | os.PathLike[str]) -> str:
    """A file's name for a message, as the user can open it (relative below the working directory,
    else absolute), on one printable line whatever bytes it holds."""
    text = os.fspath(path)
    with contextlib.suppress(OSError, ValueError):
        rel = os.path.relpath(text)
        text = rel if not rel.startswith("..") else os.path.abspath(text)
    return for_message(text, _NAME_MAX)


def count(value: Any, where: str, default: int = 0) -> int:
    """A whole number in 0..``COUNT_MAX`` (``12.0`` is taken); None is ``default``."""
    n = whole(value, where, 0, COUNT_MAX)
    return default if n is None else n


def whole(value: Any, where: str, low: int = -(1 << 63), high: int = TS_MAX) -> int | None:
    """A whole number in ``low``..``high`` (an exit code, a turn); None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Rejected(f"{where} is {quoted(value, 60)}, not a whole number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise Rejected(f"{where} is {quoted(value, 60)}, not a whole number")
    if not low <= value <= high:
        raise Rejected(f"{where} is {quoted(value, 60)}, outside {low}..{high}")
    return int(value)


def seconds(value: Any, where: str) -> float | None:
    """A duration (seconds or milliseconds) in 0..``SECONDS_MAX``; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Rejected(f"{where} is {quoted(value, 60)}, not a duration")
    if not (math.isfinite(value) and 0 <= value <= SECONDS_MAX):
        raise Rejected(f"{where} is {quoted(value, 60)}, not a duration (0 to {SECONDS_MAX:.0f})")
    return float(value)


def time_ns(value: Any, where: str, default: int) -> int:
    """A time in ns since 1970 (an amb export's exact timestamps) in 0..``TS_MAX``; None is ``default``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise Rejected(f"{where} is {quoted(value, 60)}, not a time in nanoseconds")
    check_ns(value, where)
    return value


def check_ns(ns: int, where: str) -> int:
    if not 0 <= ns <= TS_MAX:
        raise Rejected(f"{where} {when(ns)} {OUTSIDE}")
    return ns


def datetime_ns(dt: datetime, where: str) -> int:
    """Nanoseconds since 1970 of a datetime, refused outside what the store's clock holds."""
    try:
        seconds = int(dt.timestamp())
    except (OverflowError, OSError, ValueError):
        raise Rejected(f"{where} {dt.isoformat()} {OUTSIDE}") from None
    return check_ns(seconds * 1_000_000_000 + dt.microsecond * 1000, where)


def iso_ns(value: Any, where: str) -> int | None:
    """A time given as ISO 8601 text or a datetime, in ns since 1970; None when it has none the clock
    can place (absent, not a time, no time zone); refused when it is outside what a run holds."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        return None
    return datetime_ns(value, where)


def when(ns: int) -> str:
    """A time in nanoseconds for a message: ISO 8601 (UTC) where a datetime holds it."""
    try:
        return datetime.fromtimestamp(ns / 1e9, UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns since 1970"


_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a surrogate: the only way a decoded JSON document can hold one (UTF-8 input
cannot), and, paired, how ``ensure_ascii`` writers spell every character above U+FFFF."""


def check_text(raw: str | bytes, doc: Any, where: str) -> None:
    """Refuse a decoded JSON document that holds a lone surrogate, naming where (a JSON path).
    Looked for only when the raw text escapes a surrogate, which is cheap to find."""
    probe = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    if not _SURROGATE_ESCAPE.search(probe):
        return
    found = _first_surrogate(doc, "")
    if found is not None:
        at = found[0].lstrip(".")
        raise Rejected(f"{where}: {at}: {NOT_UNICODE} (a JSON escape of half a character)")


def not_unicode(value: Any) -> str:
    """Where in ``value`` (a payload's builtins) text fails to encode, and why, for a message: bytes
    a file name held that are not UTF-8 (decoded as ``surrogateescape``) or a lone surrogate."""
    found = _first_surrogate(value, "")
    if found is None:
        return NOT_UNICODE
    at, text = found
    raw = all("\udc80" <= c <= "\udcff" for c in _SURROGATE.findall(text))
    why = "bytes that are not UTF-8" if raw else "a lone surrogate"
    return f"{at.lstrip('.') or 'a string'} '{for_message(text, 200)}': text that is not Unicode ({why})"


def _first_surrogate(value: Any, path: str) -> tuple[str, str] | None:
    """(JSON path, text) of the first string or key in ``value`` holding a surrogate (iterative:
    documents nest up to 200 levels)."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return at or "the document", item
        elif isinstance(item, dict):
            for key in reversed(list(item)):
                name = f"{at}.{for_message(str(key), 80)}"
                if isinstance(key, str) and _SURROGATE.search(key):
                    return name, key
                stack.append((item[key], name))
        elif isinstance(item, list | tuple):
            stack.extend((x, f"{at}[{i}]") for i, x in reversed(list(enumerate(item))))
    return None
