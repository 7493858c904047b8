"""The completeness gate, shared by every track.

A track knows how to aggregate its case results into a TASK score (a plain mean, or the
segmentation organ/lesion formula); the gate decides which cases that aggregate sees and what
happens when some are missing or invalid. Tracks call ``gated_score`` instead of applying the gate
themselves, so the three policies mean the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scorer.grader.options import GradeOptions
from scorer.grader.result import CaseResult, case_counts

Aggregate = Callable[[Sequence[CaseResult]], float]


def mean_score(cases: Sequence[CaseResult]) -> float:
    """The default aggregate: the mean case score (0 for no cases)."""
    return sum(c.score for c in cases) / len(cases) if cases else 0.0


def gated_score(
    cases: Sequence[CaseResult], options: GradeOptions, aggregate: Aggregate = mean_score
) -> tuple[float, dict[str, Any]]:
    """The TASK score under the completeness gate, and the ``checks`` dict that explains it.

    - ``per_case_zero``: every case counts; a missing or invalid one contributes its 0.
    - ``all_or_nothing``: any missing or invalid case zeroes the TASK.
    - ``times_completion``: the aggregate over scored cases × the fraction of scored cases.
    """
    checks = case_counts(list(cases))
    checks["gate"] = options.completeness
    complete = checks["n_scored"] == checks["n_cases"]
    if not cases:
        score = 0.0
    elif options.completeness == "per_case_zero":
        score = aggregate(cases)
    elif options.completeness == "all_or_nothing":
        score = aggregate(cases) if complete else 0.0
    else:
        scored = [c for c in cases if c.status == "scored"]
        score = aggregate(scored) * checks["completion"] if scored else 0.0
    checks["gate_applied"] = not complete and options.completeness != "per_case_zero"
    return float(min(1.0, max(0.0, score))), checks
