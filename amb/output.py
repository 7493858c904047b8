"""Rendering rows for people (aligned tables) and for machines (CSV, JSON)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

import click

from schemas.display import clip, one_line


def _cell(value: Any, width: int = 60) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return clip(one_line(str(value)), width)  # agent-written text: no escape reaches the terminal


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def to_jsonable(value: Any) -> Any:
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
        writer.writerows([[to_jsonable(v) for v in row] for row in rows])
        click.echo(buf.getvalue(), nl=False)
    else:
        click.echo(table(columns, rows))
