"""Searching payloads without lowering them at every search: a lower-cased copy, kept at ingest.

The viewer's search inside a run's events is a case-insensitive substring match over each payload's
JSON text: ``contains(lower(payload), lower(q))``. Three quarters of its CPU went into ``lower`` (every
payload of the run converted at every search: ~120 ms of CPU per 100,000 events, against ~35 ms for
the scan itself). Ingest now stores ``payload_lower`` beside each payload, computed once by the same
``lower``: the lower-cased text where it differs from the payload, NULL where the payload has nothing
to lower (most events: hashes, paths, numbers, lower-case keys), so the copy costs bytes only for
the events that have capitals. ``coalesce(payload_lower, payload)`` is then ``lower(payload)`` for
every row, and the search reads it instead of computing it: the same rows, by construction
(``tests/replay/test_payload_search.py`` compares both on hostile strings).

Migration ``core.m006_i18_payload_lower`` adds and fills the column in older stores. It is derived
data outside the hash, like the hot columns (``replay.hot``), so ``amb verify`` re-derives it and
reports an event whose copy differs from its payload. DuckDB's full-text search extension is no
substitute: it is not part of the Python wheel (it would be downloaded at run time, which cannot
work offline), and it matches stemmed words, not substrings.
"""

from __future__ import annotations

import duckdb

COLUMN = "payload_lower"


def derive(text: str) -> str:
    """The column's value for a payload's JSON text (``text``, an SQL expression of type VARCHAR)."""
    return f"CASE WHEN lower({text}) <> {text} THEN lower({text}) END"


def present(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``events`` has the column (a store migrated past ``core.m006_i18_payload_lower``)."""
    rows = con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE table_name = 'events' AND column_name = ?", [COLUMN]
    ).fetchall()
    return bool(rows[0][0])


def matches(con: duckdb.DuckDBPyConnection) -> str:
    """The SQL condition "the payload contains ``?``, ignoring case" (one parameter: the text)."""
    if present(con):
        return f"contains(coalesce({COLUMN}, CAST(payload AS VARCHAR)), lower(?))"
    # A store no writer has opened since the column came (the viewer only reads): the same rows.
    return "contains(lower(CAST(payload AS VARCHAR)), lower(?))"


def add_and_backfill(con: duckdb.DuckDBPyConnection) -> None:
    """The migration: add the column to ``events`` and fill it from the payloads already stored."""
    con.execute(f"ALTER TABLE events ADD COLUMN {COLUMN} VARCHAR")
    con.execute(f"UPDATE events SET {COLUMN} = {derive('CAST(payload AS VARCHAR)')}")
