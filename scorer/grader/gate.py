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
    - ``all_or_nothing_missing``: any missing case zeroes the TASK; invalid ones stay in the
      aggregate (the track decides what an invalid case contributes).
    - ``times_completion``: the aggregate over scored cases × the fraction of scored cases.
    - ``mean_over_valid``: the aggregate over scored cases only (0 when there is none).

    ``checks["gate_applied"]`` is true when the gate changed the score's basis (cases were zeroed
    out or left out); ``checks["gate_zeroed"]`` when it forced the TASK to 0.
    """
    checks = case_counts(list(cases))
    checks["gate"] = options.completeness
    complete = checks["n_scored"] == checks["n_cases"]
    scored = [c for c in cases if c.status == "scored"]
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
