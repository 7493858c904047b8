"""What flows into a score row (``schemas.score_row.ScoreRow``): ``Grade`` (TASK side) and ``Cost``
(usage side)."""

from __future__ import annotations

from typing import Any

import msgspec

from replay.summary import Tokens


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
