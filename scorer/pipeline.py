"""One run's events → one ledger row, under one profile and one judge. No store writes here.

Order: fold the events → audit → grade the sealed submission (cached) → evidence view → judge the
rubric items → S1–S5 → AGENTIC/TASK/OVERALL → error codes → cost. A violation zeroes S1–S5 and
AGENTIC, excludes TASK (None, reason ``excluded: violation``) and sets OVERALL to 0, and the row
keeps its cost. The row's ``fingerprint`` is the sha256 of everything in it that a rescore must
reproduce (not when or in which batch it was computed), which is what the rescoring tests compare.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec

from schemas.codec import Event, canonical_digest
from scorer import audit as auditor
from scorer import codes as error_codes
from scorer import evidence as ev
from scorer import medal, stages, taskgrade
from scorer.cost import PriceTable, price_run
from scorer.judge.base import Judge
from scorer.profile import LoadedProfile
from scorer.row import Cost, Grade, ScoreRow
from scorer.trajectory import BlobGetter, Trajectory, fold


@lru_cache(maxsize=256)
def task_info(task: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(track, forbidden paths) of a task id; (None, ()) when the task is unknown."""
    if not task:
        return None, ()
    try:
        from tasks.registry import load_spec

        spec = load_spec(task)
    except Exception:  # an unknown task is reported in the row (TASK unscored), not raised
        return None, ()
    return spec.track, tuple(spec.forbidden_paths)


class RunScorer:
    def __init__(
        self,
        profile: LoadedProfile,
        judge: Judge,
        get_blob: BlobGetter,
        prices: PriceTable,
        *,
        references: Path | None = None,
        grade_cache: dict[str, dict[str, Any]] | None = None,
    ):
        self.loaded = profile
        self.p = profile.profile
        self.judge = judge
        self.get_blob = get_blob
        self.prices = prices
        self.references = references
        self.grade_cache = grade_cache if grade_cache is not None else {}

    def score(self, run_id: str, events: list[Event]) -> ScoreRow:
        traj = fold(run_id, events, self.get_blob)
        return self.score_trajectory(traj)

    def score_trajectory(self, traj: Trajectory) -> ScoreRow:
        p = self.p
        track, forbidden = task_info(traj.task)
        rules = p.stage_rules(track)
        audit = auditor.audit(traj, p.audit, list(forbidden))
        reasons: dict[str, str] = {}
        if audit.status == "no_data":
            summary: dict[str, Any] = taskgrade.unscored("no events recorded for this run")
            grade_key = None
        else:
            summary, grade_key = taskgrade.grade_run(
                traj,
                self.get_blob,
                references=self.references,
                metrics=p.metrics_for(track),
                cache=self.grade_cache,
            )
        grade = Grade.of(summary)
        evidence = ev.build(traj, p.evidence, self.get_blob, track=track, grade=_grade_facts(summary))
        items = p.items_for(track, traj.tier)
        if audit.status == "no_data":
            verdicts = {}
        else:
            verdicts = self.judge.judge(
                traj,
                evidence,
                [i for i in items if not (traj.tier and traj.tier in i.auto_credit)],
                track=track,
            )
        scores = stages.item_scores(items, verdicts, traj.tier)
        judged = stages.judged_stages(scores, rules)
        s4, s5, s45_reason = taskgrade.s4_s5(summary, rules)
        stage_values: dict[str, float | None] = {s: v for s, (v, _) in judged.items()}
        stage_values["S4"], stage_values["S5"] = s4, s5
        for s, (_, why) in judged.items():
            if why:
                reasons[s] = why
        if s45_reason:
            reasons["S4"] = reasons["S5"] = s45_reason
        task = grade.task_score
        if task is None:
            reasons["TASK"] = grade.reason or "unscored"
        breach = audit.status == "violation"
        if breach:
            stage_values = {s: 0.0 for s in stage_values}
            task = None
            reasons = {"S1-S5": "zeroed: rule violation", "TASK": "excluded: rule violation"}
            combined: dict[str, Any] = {"agentic": 0.0, "overall": 0.0, "agentic_reason": None, "task": None}
        elif traj.status == "budget_exceeded" and p.budget.exceeded != "score":
            # The profile's rule for a run whose budget ran out (see scorer.profile.BudgetRules).
            if p.budget.exceeded == "zero":
                stage_values = {s: 0.0 for s in stage_values}
                task = 0.0
                reasons = {"S1-S5": "zeroed: budget exceeded", "TASK": "zeroed: budget exceeded"}
                combined = {"agentic": 0.0, "overall": 0.0, "agentic_reason": None, "task": 0.0}
            else:
                stage_values = {s: None for s in stage_values}
                task = None
                why = "excluded: budget exceeded"
                reasons = {"S1-S5": why, "TASK": why, "AGENTIC": why, "OVERALL": why}
                combined = {"agentic": None, "overall": None, "agentic_reason": why, "task": None}
        else:
            combined = stages.combine(
                stage_values,
                task,
                p.weights,
                rules.null_policy,
                all_unscored=rules.all_unscored,
                round_digits=rules.round_digits,
            )
            if combined["agentic_reason"]:
                reasons["AGENTIC"] = combined["agentic_reason"]
        assessed = medal.assess(grade, traj.task, p.medals.get(track or ""), breach=breach)
        if assessed.reason and not breach:
            reasons["rating"] = assessed.reason
        fired = error_codes.detect(traj, summary if task is not None or not breach else None)
        judge_codes = getattr(self.judge, "codes", None)
        if judge_codes is not None and audit.status != "no_data":
            found, why = judge_codes(traj, evidence)
            if why:
                reasons["codes"] = f"judge codes unscored: {why}"
            fired = error_codes.merge(
                fired,
                [
                    error_codes.Code(code=c["code"], reason=c["reason"], events=c["events"], source="judge")
                    for c in found
                ],
            )
        suppressed = (
            p.codes.suppress_when_valid_and_okay
            and assessed.valid
            and assessed.medal in ("good", "okay")
            and bool(fired)
        )
        if suppressed:
            reasons["codes"] = f"suppressed: valid submission with medal {assessed.medal}"
        cost = Cost.of(price_run(traj, self.prices))
        if cost.cost_reason:
            reasons["cost"] = cost.cost_reason
        row = ScoreRow(
            run_id=traj.run_id,
            profile_id=self.loaded.id,
            profile_name=self.loaded.name,
            judge=self.judge.label,
            agent=traj.agent,
            model=traj.model,
            task=traj.task,
            track=track,
            tier=traj.tier,
            repeat=_repeat(traj.labels),
            s1=stage_values["S1"],
            s2=stage_values["S2"],
            s3=stage_values["S3"],
            s4=stage_values["S4"],
            s5=stage_values["S5"],
            agentic=combined["agentic"],
            task_score=combined["task"],
            overall=combined["overall"],
            status=_status(traj, audit.status, summary, p.budget.exceeded),
            audit_status=audit.status,
            turns=len(traj.model_calls),
            wall_s=traj.duration_s,
            tokens_in=cost.tokens.input,
            tokens_out=cost.tokens.output,
            tokens_cache_read=cost.tokens.cache_read,
            tokens_cache_write=cost.tokens.cache_write,
            tokens_reasoning=cost.tokens.reasoning,
            cost_usd=cost.cost,
            cost_estimated=cost.estimated,
            price_table=cost.price_table,
            codes=[] if suppressed else [c.code for c in fired],
            n_violations=len(audit.violations),
            reasons=reasons,
            details={
                "items": [msgspec.to_builtins(s) for s in scores],
                "codes": [{**msgspec.to_builtins(c), "suppressed": suppressed} for c in fired],
                "violations": [msgspec.to_builtins(v) for v in audit.violations],
                "grade": summary,
                "grade_key": grade_key,
                "cost_source": cost.cost_source,
            },
            evidence_sha256=evidence.sha256,
            fingerprint="",
            medal=assessed.medal,
            rating=assessed.rating,
        )
        row.fingerprint = fingerprint(row)
        return row


def fingerprint(row: ScoreRow) -> str:
    body = {k: v for k, v in row.as_dict().items() if k != "fingerprint"}
    return canonical_digest(body)


def _grade_facts(grade: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "metric",
        "n_cases",
        "n_missing",
        "n_invalid",
        "completion",
        "format_valid",
        "has_valid_results",
        "task_score",
        "reason",
    )
    return {k: grade[k] for k in keep if k in grade}


def _repeat(labels: dict[str, str]) -> int | None:
    for key in ("repeat", "repeat_idx", "rep"):
        if key in labels:
            try:
                return int(labels[key])
            except ValueError:
                return None
    return None


def _status(traj: Trajectory, audit_status: str, grade: dict[str, Any], budget_rule: str = "score") -> str:
    """completed / failed / timeout / budget_exceeded / breach / no_data / ungraded (the paper's run
    status; a run over its budget is ``budget_exceeded`` when the profile does not score it, or when
    it left nothing scoreable, as a timed-out run is ``timeout``)."""
    if audit_status == "no_data":
        return "no_data"
    if audit_status == "violation":
        return "breach"
    over_budget = traj.status == "budget_exceeded"
    if over_budget and budget_rule != "score":
        return "budget_exceeded"
    if grade.get("task_score") is None:
        return "ungraded"
    scoreable = grade.get("n_cases", 0) > grade.get("n_missing", 0) + grade.get("n_invalid", 0)
    if scoreable:
        return "completed"
    if over_budget:
        return "budget_exceeded"
    return "timeout" if traj.status == "timeout" else "failed"
