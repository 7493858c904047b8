"""The completeness gate, shared by every track: the track aggregates its case results into a TASK
score, the gate decides which cases that aggregate sees, so a policy means the same everywhere."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scorer.grader.options import GradeOptions
from scorer.grader.result import CaseResult

Aggregate = Callable[[Sequence[CaseResult]], float]


def mean_score(cases: Sequence[CaseResult]) -> float:
    """The default aggregate: the mean case score (0 for no cases)."""
    return sum(c.score for c in cases) / len(cases) if cases else 0.0


def gated_score(
    cases: Sequence[CaseResult], options: GradeOptions, aggregate: Aggregate = mean_score
) -> tuple[float, dict[str, Any]]:
    """The TASK score under ``options.completeness`` (``GradeOptions``), and the ``checks`` that
    explain it: ``gate_applied`` when the gate changed the score's basis (cases zeroed or left
    out), ``gate_zeroed`` when it forced the TASK to 0."""
    scored = [c for c in cases if c.status == "scored"]
    n = len(cases)
    checks: dict[str, Any] = {
        "n_cases": n,
        "n_scored": len(scored),
        "n_missing": sum(1 for c in cases if c.status == "missing"),
        "n_invalid": sum(1 for c in cases if c.status == "invalid"),
        "completion": (len(scored) / n) if n else 0.0,
        "gate": options.completeness,
    }
    complete = len(scored) == n
    zeroed = False
    mode = options.completeness
    if not cases:
        score = 0.0
    elif mode == "per_case_zero":
        score = aggregate(cases)
    elif mode == "all_or_nothing":
        zeroed = not complete
        score = 0.0 if zeroed else aggregate(cases)
    elif mode == "all_or_nothing_missing":
        zeroed = checks["n_missing"] > 0
        score = 0.0 if zeroed else aggregate(cases)
    elif mode == "mean_over_valid":
        score = aggregate(scored) if scored else 0.0
    else:
        score = aggregate(scored) * checks["completion"] if scored else 0.0
    checks["gate_applied"] = not complete and mode != "per_case_zero"
    checks["gate_zeroed"] = zeroed
    return float(min(1.0, max(0.0, score))), checks
