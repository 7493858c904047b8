"""Stage scores and how they combine: S1–S3 from rubric verdicts, AGENTIC, OVERALL.

The rules (auto-credit, ``requires``, the unscored-item and null policies) are in docs/scoring.md.
An unscored part makes OVERALL unscored, never a silent 0.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import msgspec

from scorer.judge.base import Verdict
from scorer.profile import STAGES, RubricItem, StageRules, Weights


class ItemScore(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    stage: str
    value: float | None
    source: str
    """``judge`` (see ``judge``), ``auto_credit`` or ``requires:<item>``."""
    judge: str = ""
    reason: str = ""
    cited: list[str] = []
    unscored_reason: str | None = None
    call_key: str | None = None


def item_scores(items: list[RubricItem], verdicts: dict[str, Verdict], tier: str | None) -> list[ItemScore]:
    """Final item values: judge verdicts with the auto-credit and dependency rules applied."""
    out: dict[str, ItemScore] = {}
    for item in items:
        score = partial(ItemScore, id=item.id, stage=item.stage)
        v = verdicts.get(item.id)
        if tier and tier in item.auto_credit:
            why = f"credited automatically at tier {tier}"
            out[item.id] = score(value=max(item.values), source="auto_credit", reason=why)
        elif v is None:
            why = "the judge returned no verdict"
            out[item.id] = score(value=None, source="judge", unscored_reason="no_verdict", reason=why)
        else:
            out[item.id] = score(
                value=v.value,
                source="judge",
                judge=v.judge,
                reason=v.reason,
                cited=list(v.cited),
                unscored_reason=v.unscored_reason,
                call_key=v.call_key,
            )
    for item in items:
        dep = out.get(item.requires) if item.requires else None
        if dep is not None and dep.value == 0 and out[item.id].source != "auto_credit":
            why = f"forced to 0: {item.requires} is 0"
            source = f"requires:{item.requires}"
            out[item.id] = msgspec.structs.replace(
                out[item.id], value=0.0, source=source, unscored_reason=None, reason=why
            )
    return [out[i.id] for i in items]


def judged_stages(scores: list[ItemScore], rules: StageRules) -> dict[str, tuple[float | None, str | None]]:
    """S1–S3 as (value, unscored reason)."""
    result: dict[str, tuple[float | None, str | None]] = {}
    for stage in ("S1", "S2", "S3"):
        mine = [s for s in scores if s.stage == stage]
        if not mine:
            result[stage] = (None, "no rubric items for this stage")
            continue
        missing = [s for s in mine if s.value is None]
        if missing and rules.unscored_item_policy == "stage_unscored":
            result[stage] = (
                None,
                "unscored items: " + ", ".join(f"{s.id} ({s.unscored_reason})" for s in missing),
            )
            continue
        vals = [s.value for s in mine if s.value is not None]
        result[stage] = (sum(vals) / len(vals), None) if vals else (None, "every item unscored")
    return result


def agentic(
    stages: dict[str, float | None], weights: Weights, null_policy: str, all_unscored: str = "unscored"
) -> tuple[float | None, str | None]:
    """AGENTIC from S1–S5 (value or None) under ``null_policy``; (None, reason) when unscored. With no
    stage scored at all, ``all_unscored`` says 0.0 (``zero``, the branches' ``compute_workflow_score``)
    or unscored."""
    w = {s: getattr(weights, s) for s in STAGES}
    scored = {s: v for s, v in stages.items() if v is not None}
    missing = [s for s in STAGES if stages.get(s) is None]
    if not scored:
        return (0.0, None) if all_unscored == "zero" else (None, "no stage is scored")
    if missing and null_policy == "unscored":
        return None, f"unscored stages: {', '.join(missing)}"
    if null_policy == "zero" or not missing:
        return sum(w[s] * scored.get(s, 0.0) for s in STAGES) / sum(w.values()), None
    denom = sum(w[s] for s in scored)
    if denom <= 0:
        return (0.0, None) if all_unscored == "zero" else (None, "the scored stages have zero weight")
    return sum(w[s] * v for s, v in scored.items()) / denom, None


def overall(agentic_value: float | None, task: float | None, weights: Weights) -> float | None:
    if agentic_value is None or task is None:
        return None
    return weights.agentic * agentic_value + weights.task * task


def _round(v: float | None, digits: int | None) -> float | None:
    return v if v is None or digits is None else round(v, digits)


def combine(
    stages: dict[str, float | None],
    task: float | None,
    weights: Weights,
    null_policy: str,
    *,
    all_unscored: str = "unscored",
    round_digits: int | None = None,
) -> dict[str, Any]:
    """agentic, task, overall and why AGENTIC is unscored. With ``round_digits`` OVERALL is computed
    from the rounded parts and rounded again, as the branches' ``compute_overall_score`` does."""
    a, reason = agentic(stages, weights, null_policy, all_unscored)
    a, task = _round(a, round_digits), _round(task, round_digits)
    return {
        "agentic": a,
        "agentic_reason": reason,
        "task": task,
        "overall": _round(overall(a, task, weights), round_digits),
    }
