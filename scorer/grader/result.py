"""What a grader returns: one score per case and a total. A case that could not be scored keeps its
row (``score`` 0, ``status`` ``missing`` or ``invalid``, a ``reason`` naming the file and what is
wrong with it), so a zero is never silent; ``status`` is what the completeness gate counts."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from schemas.errors import AmbError

CaseStatus = Literal["scored", "missing", "invalid"]


class CaseResult(msgspec.Struct, frozen=True, kw_only=True):
    case: str
    score: float
    """In [0, 1]; 0 for a missing or invalid case."""
    reason: str | None = None
    """Why the case scored 0 (or a warning), naming the file; None for a normally scored case."""
    details: dict[str, Any] = {}
    """Per-case diagnostics (per-target Dice, PSNR, matched boxes, ...)."""
    status: CaseStatus = "scored"
    """``missing``: a required output is absent; ``invalid``: present but unreadable or malformed."""


def missing_case(case: str, reason: str, **details: Any) -> CaseResult:
    return CaseResult(case=case, score=0.0, reason=reason, details=details, status="missing")


def invalid_case(case: str, reason: str, **details: Any) -> CaseResult:
    return CaseResult(case=case, score=0.0, reason=reason, details=details, status="invalid")


class GradeResult(msgspec.Struct, frozen=True, kw_only=True):
    """The task score of one submission under one set of grade options."""

    task: str
    metric: str
    score: float
    """The TASK score in [0, 1] after the completeness gate."""
    cases: list[CaseResult]
    degraded: list[str] = []
    """What was substituted because an asset was missing (e.g. a model-based metric); empty if none."""
    params: dict[str, Any] = {}
    """The metric's pinned parameters and the grade options that shaped this score."""
    checks: dict[str, Any] = {}
    """Counts and gate outcome: n_cases, n_scored, n_missing, n_invalid, completion, gate, ..."""


class BadReference(AmbError):
    """The private references themselves are missing or unreadable: no score is meaningful."""
