"""The typed score row and what flows into it: ``Grade`` (TASK side) and ``Cost`` (usage side).

``ScoreRow`` is the one definition of the ``scores`` table's columns (after the three batch columns
``batch_id, seq, scored_at`` the ledger adds): the pipeline builds one per run, the ledger derives
each column's Arrow and SQL type from its annotation, and a test checks the migrated table against
it. A new column is a new field here, appended at the end, *and* a new named migration in
``scorer.migrations`` (old migrations are never edited).
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import msgspec

from replay.summary import Tokens

Medal = Literal["good", "okay", "fail"]
Rating = Literal["A", "B", "C", "F"]


class Grade(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The grader's result as the scorer keeps it (``taskgrade.summarise``), or why there is none."""

    task_score: float | None = None
    reason: str | None = None
    """Why TASK is unscored (set only then)."""
    metric: str = ""
    n_cases: int = 0
    n_missing: int = 0
    n_invalid: int = 0
    completion: float | None = None
    """Share of cases with an output (present, valid or not)."""
    format_valid: bool = False
    """Every present output is well formed and at least one exists."""
    has_valid_results: bool = False
    degraded: list[str] = []
    problems: list[str] = []
    medal_metric: float | None = None
    """The track's medal input before the completeness gate (None: use TASK)."""
    gate_zeroed: bool = False
    """The completeness gate forced TASK to 0."""
    mean_psnr_db: float | None = None
    mean_ssim_raw: float | None = None

    @property
    def scored(self) -> bool:
        return self.task_score is not None and self.completion is not None

    @property
    def n_valid(self) -> int:
        return self.n_cases - self.n_missing - self.n_invalid

    @property
    def complete_and_valid(self) -> bool:
        """Every case has a well-formed output: the branches' ``output_format_valid``."""
        return self.scored and self.n_cases > 0 and self.n_missing == 0 and self.n_invalid == 0

    @classmethod
    def of(cls, summary: dict[str, Any]) -> Grade:
        """From a stored summary (older summaries lack the newer keys; unknown keys are ignored)."""
        known = {k: v for k, v in summary.items() if k in cls.__struct_fields__}
        return msgspec.convert(known, cls)


class Cost(msgspec.Struct, kw_only=True):
    """Usage of a run's model calls priced under one table (``scorer.cost.price_run``)."""

    tokens: Tokens
    cost: float | None
    cost_reason: str | None
    price_table: str
    estimated: bool
    cost_source: str | None = None
    """What the cost came from: ``reported`` (the provider's own figure), ``table``, both joined by
    ``+``, or None when nothing was priced (``scorer.cost.price_run``)."""

    @classmethod
    def of(cls, priced: dict[str, Any]) -> Cost:
        return msgspec.convert(priced, cls)


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


def _base(annotation: Any) -> Any:
    """``X | None`` -> X; a Literal of strings -> str."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0]
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
        elif t is bool:
            out[name] = "BOOLEAN"
        elif t is int:
            out[name] = "INTEGER" if name in _INTS_32 else "BIGINT"
        elif t is float:
            out[name] = "DOUBLE"
        else:
            out[name] = "VARCHAR"
    return out
