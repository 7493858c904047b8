"""Case-insensitive search in payloads without lowering them (the bulk of a search's CPU): one
pattern that matches what ``lower`` would have matched.

DuckDB's ``lower`` maps each code point to one code point, so each character of ``lower(q)`` becomes
the class of every character ``lower`` turns into it (``k``: ``[Kk\u212a]``, the Kelvin sign), read
from DuckDB's own ``lower`` once per process: the rows found are the same by construction. A query
the pattern cannot express (very long) falls back to lowering.
"""

from __future__ import annotations

import string
import threading

import duckdb

CASED_BELOW = 0x20000
"""No code point at or above this has a lower-case mapping (Unicode's cased scripts end in plane 1)."""
MAX_QUERY = 256
"""Longer queries fall back to lowering (the pattern's size grows with the query)."""
FALLBACK = "contains(lower(CAST(payload AS VARCHAR)), lower(?))"

_lock = threading.Lock()
_sources: dict[str, frozenset[str]] | None = None
_changed: frozenset[str] = frozenset()


def lowered_from(con: duckdb.DuckDBPyConnection) -> dict[str, frozenset[str]]:
    """For each character that DuckDB's ``lower`` produces from another one: every character it comes
    from (read once per process from ``lower`` itself)."""
    global _sources, _changed
    with _lock:
        if _sources is None:
            rows = con.execute(
                f"""SELECT i, lower(chr(i::INTEGER)) FROM range(1, {CASED_BELOW}) AS t(i)
                    WHERE (i < 55296 OR i > 57343) AND lower(chr(i::INTEGER)) <> chr(i::INTEGER)"""
            ).fetchall()
            sources: dict[str, set[str]] = {}
            for code, low in rows:
                if len(low) != 1:  # not one code point for one: no pattern is exact, lower instead
                    sources = {}
                    break
                sources.setdefault(low, set()).add(chr(code))
            _sources = {low: frozenset(s) for low, s in sources.items()}
            _changed = frozenset(chr(code) for code, _ in rows) if _sources else frozenset()
        return _sources


def _escape(c: str) -> str:
    """One character as RE2 reads it literally, in a class or not."""
    if c.isascii() and c.isalnum():
        return c
    if c in string.punctuation:
        return "\\" + c
    return f"\\x{{{ord(c):x}}}"  # spaces, controls, anything beyond ASCII


def pattern(con: duckdb.DuckDBPyConnection, q: str) -> str | None:
    """The RE2 pattern matching exactly the texts whose ``lower`` contains ``lower(q)``; None when the
    query is to be searched by lowering (too long, or DuckDB's ``lower`` is not one-to-one)."""
    sources = lowered_from(con)
    if not sources or len(q) > MAX_QUERY:
        return None
    low = con.execute("SELECT lower(?)", [q]).fetchall()[0][0]
    parts = []
    for c in low:
        # The characters whose lower-case is c: those lower maps to c, and c itself unless lower
        # changes it (then no character of a payload lowers to c, and nothing matches).
        chars = set(sources.get(c, ())) | ({c} if c not in _changed else set())
        if not chars:  # only if lower were not idempotent: lowering answers that exactly
            return None
        if len(chars) == 1:
            parts.append(_escape(next(iter(chars))))
        else:
            parts.append("[" + "".join(_escape(x) for x in sorted(chars)) + "]")
    return "".join(parts)


def matches(con: duckdb.DuckDBPyConnection, q: str) -> tuple[str, str]:
    """(the SQL condition "the payload contains ``q``, ignoring case", its one parameter)."""
    found = pattern(con, q)
    if found is None:
        return FALLBACK, q
    return "regexp_matches(CAST(payload AS VARCHAR), ?)", found
