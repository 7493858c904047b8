"""The score row: one run scored under one profile and one judge, the one definition of the ``scores``
table's columns (after the three batch columns ``batch_id, seq, scored_at`` the ledger adds).

The scorer's pipeline builds one per run and its ledger writes it, each column's Arrow and SQL type
derived from its annotation (a test checks the migrated table against it); the viewer reads the
current rows back as it. The field order is the table's column order: a new column is a new field
appended at the end *and* a new named migration in ``scorer.migrations`` (old migrations are never
edited).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Collection
from typing import Any, Literal

import msgspec

Medal = Literal["good", "okay", "fail"]
Rating = Literal["A", "B", "C", "F"]


class ScoreRow(msgspec.Struct, kw_only=True):
    """One run scored under one profile and one judge: the ``scores`` table's columns, in order."""

    run_id: str
    profile_id: str
    profile_name: str
    judge: str
    agent: str | None
    model: str | None
    task: str | None
    track: str | None
    tier: str | None
    repeat: int | None
    s1: float | None
    s2: float | None
    s3: float | None
    s4: float | None
    s5: float | None
    agentic: float | None
    task_score: float | None
    overall: float | None
    status: str
    audit_status: str
    turns: int | None
    wall_s: float | None
    tokens_in: int | None
    tokens_out: int | None
    tokens_cache_read: int | None
    tokens_cache_write: int | None
    tokens_reasoning: int | None
    cost_usd: float | None
    cost_estimated: bool | None
    price_table: str | None
    codes: list[str]
    n_violations: int | None
    reasons: dict[str, str]
    details: dict[str, Any]
    """The per-item verdicts (``items``), the fired codes and the audit's violations with the events
    they cite (``codes``, ``violations``), the grader's summary (``grade``)."""
    evidence_sha256: str | None
    fingerprint: str
    # --- scorer.m002_medal_rating -------------------------------------------------------------------
    medal: Medal | None = None
    rating: Rating | None = None

    def __getitem__(self, key: str) -> Any:
        # Rows are read by column name all over the reports; a typo is still an error.
        if key not in self.__struct_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__struct_fields__}


COLUMNS: tuple[str, ...] = ScoreRow.__struct_fields__
JSON_COLUMNS = frozenset({"reasons", "details"})
_INTS_32 = frozenset({"repeat", "turns", "n_violations"})


STORED_COLUMNS = "SELECT column_name FROM duckdb_columns() WHERE table_name = 'scores'"
"""The columns a store's ``scores`` table has (what ``select_list`` is given)."""


def select_list(stored: Collection[str], wanted: Collection[str] = COLUMNS) -> str:
    """The row's columns (the ``wanted`` ones) for a SELECT from ``scores`` (or ``scores_current``)
    whose columns are ``stored``: a store opened read-only may predate a column (its migration runs
    at the next write), which then reads as NULL, what the rows written before it hold anyway."""
    return ", ".join(c if c in stored else f"NULL AS {c}" for c in COLUMNS if c in wanted)


def _base(annotation: Any) -> Any:
    """``X | None`` -> X; a Literal of strings -> str."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is Literal:
        return str
    return annotation


def column_types() -> dict[str, str]:
    """Column -> DuckDB type, derived from ``ScoreRow``'s annotations."""
    hints = typing.get_type_hints(ScoreRow)
    out = {}
    for name in COLUMNS:
        t = _base(hints[name])
        if name in JSON_COLUMNS:
            out[name] = "JSON"
        elif typing.get_origin(t) is list:
            out[name] = "VARCHAR[]"
        elif t is int:
            out[name] = "INTEGER" if name in _INTS_32 else "BIGINT"
        else:
            out[name] = {bool: "BOOLEAN", float: "DOUBLE"}.get(t, "VARCHAR")
    return out
