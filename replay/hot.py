"""Typed hot columns: payload fields that queries read most, stored beside the payload at ingest
from the JSON parse it already makes, each ``TRY_CAST`` to its type (docs/storage.md). They are
outside the hash: ``amb verify`` re-derives each from the payload.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb


class HotColumn(NamedTuple):
    name: str
    sql_type: str
    path: str
    """JSONPath inside the payload (without the leading ``$.``)."""
    doc: str


HOT_COLUMNS: list[HotColumn] = [
    HotColumn("model", "VARCHAR", "model", "model_call.completed and run.started: the model."),
    # (the token columns' docs are also those of the model_calls view's columns)
    HotColumn("input_tokens", "BIGINT", "usage.input_total", "Input tokens, cached ones included."),
    HotColumn("cache_read_tokens", "BIGINT", "usage.cache_read", "Part of input read from cache."),
    HotColumn("cache_write_tokens", "BIGINT", "usage.cache_write", "Part of input written to cache."),
    HotColumn("output_tokens", "BIGINT", "usage.output", "Output tokens, reasoning included."),
    HotColumn("reasoning_tokens", "BIGINT", "usage.reasoning", "Part of output spent on reasoning."),
    HotColumn("latency_ms", "DOUBLE", "latency_ms", "Model call: total latency."),
    HotColumn("tool_name", "VARCHAR", "name", "tool_call.requested: the tool's name."),
    HotColumn("tool_call_id", "VARCHAR", "tool_call_id", "tool_call.requested / .result: the pairing id."),
    HotColumn("status", "INTEGER", "status", "Model call, network request: the HTTP status."),
    HotColumn("path", "VARCHAR", "path", "file.*, network.request: the path."),
    HotColumn("exit_code", "INTEGER", "exit_code", "process.exited, run.finished: the exit code."),
    # (added by core.m007_hot_column_ok; a new column goes last, and gets its own migration)
    HotColumn("ok", "BOOLEAN", "ok", "model_call.completed: False for a failed call."),
]


def cast(text_expr: str, column: HotColumn) -> str:
    """``text_expr`` (the field as JSON-extracted text) cast to the column's type, as ingest stores it."""
    if column.sql_type == "VARCHAR":
        return text_expr
    return f"TRY_CAST({text_expr} AS {column.sql_type})"


def from_payload(column: HotColumn, payload: str = "payload") -> str:
    """The column's value re-derived from a stored payload (the backfill and ``amb verify``)."""
    return cast(f"json_extract_string({payload}, '$.{column.path}')", column)


def stored(con: duckdb.DuckDBPyConnection) -> list[HotColumn]:
    """The hot columns ``events`` has: all once migrated; fewer or none in a store an older amb made
    that no writer has opened since (read-only commands do not migrate)."""
    rows = con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' AND table_name = 'events'"
    ).fetchall()
    names = {r[0] for r in rows}
    return [c for c in HOT_COLUMNS if c.name in names]


def present(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``events`` has every hot column (a store migrated past the last migration adding one)."""
    return len(stored(con)) == len(HOT_COLUMNS)


def add_and_backfill(con: duckdb.DuckDBPyConnection) -> None:
    """The migrations: add the columns ``events`` lacks and fill them from the payloads already stored."""
    have = {c.name for c in stored(con)}
    missing = [c for c in HOT_COLUMNS if c.name not in have]
    for c in missing:
        con.execute(f"ALTER TABLE events ADD COLUMN {c.name} {c.sql_type}")
    if missing:
        con.execute(f"UPDATE events SET {', '.join(f'{c.name} = {from_payload(c)}' for c in missing)}")
