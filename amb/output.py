"""Rendering rows for people (aligned tables) and for machines (CSV, JSON)."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click

from schemas.display import one_line, table

__all__ = ["cell", "emit", "emit_batches", "table", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # inf, -inf, nan: JSON has no such number (its text, as CSV writes it)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def emit(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = "table") -> None:
    emit_batches(columns, [rows], fmt)


def emit_batches(
    columns: Sequence[str], batches: Iterable[Sequence[Sequence[Any]]], fmt: str = "table"
) -> None:
    """``emit`` of rows that arrive in batches (a query's result): CSV and JSON are written batch by
    batch, so a result of any size takes the memory of one batch; a table needs every row first
    (its column widths)."""
    if fmt == "json":
        written = 0
        for rows in batches:
            if not rows:
                continue
            objects = [{c: to_jsonable(v) for c, v in zip(columns, row, strict=False)} for row in rows]
            # The batch's part of the text json.dumps(every_row, indent=2) is: its list without
            # the brackets' lines.
            inner = json.dumps(objects, indent=2, default=str)[2:-2]
            click.echo(("[\n" if not written else ",\n") + inner, nl=False)
            written += len(rows)
        click.echo("\n]" if written else "[]")
    elif fmt == "csv":
        # On a terminal (as `ls` does) the agent's text is shown escaped, not obeyed; piped or
        # redirected, the CSV holds every value as stored.
        shown = one_line if sys.stdout.isatty() else None
        click.echo(_csv_text([columns]), nl=False)
        for rows in batches:
            values = [[to_jsonable(v) for v in row] for row in rows]
            if shown is not None:
                values = [[shown(v) if isinstance(v, str) else v for v in row] for row in values]
            click.echo(_csv_text(values), nl=False)
    else:
        click.echo(table(columns, [row for rows in batches for row in rows]))


def _csv_text(rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


def cell(v: Any) -> str:
    """A value in a table cell: none as a dash, floats to 4 places, lists joined by commas."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list):
        return ",".join(v) or "-"
    return str(v)
