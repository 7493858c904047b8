"""Rendering rows for people (aligned tables) and for machines (CSV, JSON)."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import click

from schemas.display import one_line, table

__all__ = ["cell", "emit", "table", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # inf, -inf, nan: JSON has no such number (its text, as CSV writes it)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def emit(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = "table") -> None:
    if fmt == "json":
        click.echo(
            json.dumps(
                [{c: to_jsonable(v) for c, v in zip(columns, row, strict=False)} for row in rows],
                indent=2,
                default=str,
            )
        )
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(columns)
        values = [[to_jsonable(v) for v in row] for row in rows]
        if sys.stdout.isatty():
            # On a terminal (as `ls` does) the agent's text is shown escaped, not obeyed; piped or
            # redirected, the CSV holds every value as stored.
            values = [[one_line(v) if isinstance(v, str) else v for v in row] for row in values]
        writer.writerows(values)
        click.echo(buf.getvalue(), nl=False)
    else:
        click.echo(table(columns, rows))


def cell(v: Any) -> str:
    """A value in a table cell: none as a dash, floats to 4 places, lists joined by commas."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list):
        return ",".join(v) or "-"
    return str(v)
