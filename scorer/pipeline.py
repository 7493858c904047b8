"""One run's events → one ledger row, under one profile and one judge. No store writes here.

A violation zeroes S1–S5 and AGENTIC, excludes TASK and sets OVERALL to 0; the row keeps its cost.
The row's ``fingerprint`` is the sha256 of everything in it that a rescore must reproduce (not when
or in which batch it was computed), which is what the rescoring tests compare.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from schemas.codec import Event, canonical_digest
from schemas.score_row import ScoreRow
from scorer import audit as auditor
from scorer import codes as error_codes
from scorer import evidence as ev
from scorer import medal, stages, taskgrade
from scorer.audit import AuditResult
from scorer.cost import PriceTable, price_run
from scorer.judge.base import Judge
from scorer.profile import AuditRules, LoadedProfile, StageRules
from scorer.row import Cost, Grade
from scorer.signals import task_spec
from scorer.stages import ItemScore
from scorer.trajectory import BlobGetter, Trajectory, fold


def task_info(task: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(track, forbidden paths) of a task id; (None, ()) when the task is unknown."""
    spec = task_spec(task)
    return (None, ()) if spec is None else (spec.track, tuple(spec.forbidden_paths))


def audit_run(traj: Trajectory, rules: AuditRules) -> AuditResult:
    """The auditor over one run with its task's forbidden paths: the one call that scoring, ``amb
    audit`` and the built-in audit scanner share."""
    _, forbidden = task_info(traj.task)
    return auditor.audit(traj, rules, list(forbidden))


class Scoring:
    """One run part-way through ``STAGES``: each stage reads what the ones before it set. ``reasons``
    is filled in stage order (a later stage may overwrite an earlier one's reason)."""

    rules: StageRules
    audit: AuditResult
    summary: dict[str, Any]
    grade_key: str | None
    grade: Grade
    evidence: ev.Evidence
    scores: list[ItemScore]
    stage_values: dict[str, float | None]
    combined: dict[str, Any]
    assessed: medal.MedalResult
    fired: list[error_codes.Code]
    suppressed: bool
    cost: Cost

    def __init__(self, traj: Trajectory):
        self.traj = traj
        self.track = task_info(traj.task)[0]
        self.reasons: dict[str, str] = {}

    @property
    def no_data(self) -> bool:
        return self.audit.status == "no_data"

    @property
    def breach(self) -> bool:
        return self.audit.status == "violation"


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
        return self.score_trajectory(fold(run_id, events, self.get_blob))

    def score_trajectory(self, traj: Trajectory) -> ScoreRow:
        s = Scoring(traj)
        for stage in STAGES:
            stage(self, s)
        row = self._row(s)
        row.fingerprint = fingerprint(row)
        return row

    def _audit(self, s: Scoring) -> None:
        s.rules = self.p.stage_rules(s.track)
        s.audit = audit_run(s.traj, self.p.audit)

    def _grade(self, s: Scoring) -> None:
        if s.no_data:
            s.summary, s.grade_key = taskgrade.unscored("no events recorded for this run"), None
        else:
            s.summary, s.grade_key = taskgrade.grade_run(
                s.traj,
                self.get_blob,
                references=self.references,
                metrics=self.p.metrics_for(s.track),
                cache=self.grade_cache,
            )
        s.grade = Grade.of(s.summary)

    def _judge(self, s: Scoring) -> None:
        traj, track = s.traj, s.track
        facts = _grade_facts(s.summary)
        s.evidence = ev.build(traj, self.p.evidence, self.get_blob, track=s.track, grade=facts)
        items = self.p.items_for(track, traj.tier)
        verdicts = {}
        if not s.no_data:
            judged = [i for i in items if not (traj.tier and traj.tier in i.auto_credit)]
            verdicts = self.judge.judge(traj, s.evidence, judged, track=track)
        s.scores = stages.item_scores(items, verdicts, traj.tier)

    def _stages(self, s: Scoring) -> None:
        judged = stages.judged_stages(s.scores, s.rules)
        s4, s5, s45_reason = taskgrade.s4_s5(s.summary, s.rules)
        s.stage_values = {st: v for st, (v, _) in judged.items()} | {"S4": s4, "S5": s5}
        s.reasons.update({st: why for st, (_, why) in judged.items() if why})
        if s45_reason:
            s.reasons["S4"] = s.reasons["S5"] = s45_reason
        if s.grade.task_score is None:
            s.reasons["TASK"] = s.grade.reason or "unscored"

    def _combine(self, s: Scoring) -> None:
        """AGENTIC, TASK and OVERALL: a violation zeroes the stages and excludes TASK; a run over its
        budget follows the profile's rule (see scorer.profile.BudgetRules); else the paper's
        combination."""
        rule = self.p.budget.exceeded
        over_budget = s.traj.status == "budget_exceeded" and rule != "score"
        if s.breach:
            s.stage_values = dict.fromkeys(s.stage_values, 0.0)
            s.reasons = {"S1-S5": "zeroed: rule violation", "TASK": "excluded: rule violation"}
            s.combined = {"agentic": 0.0, "overall": 0.0, "agentic_reason": None, "task": None}
        elif over_budget and rule == "zero":
            s.stage_values = dict.fromkeys(s.stage_values, 0.0)
            s.reasons = {"S1-S5": "zeroed: budget exceeded", "TASK": "zeroed: budget exceeded"}
            s.combined = {"agentic": 0.0, "overall": 0.0, "agentic_reason": None, "task": 0.0}
        elif over_budget:
            why = "excluded: budget exceeded"
            s.stage_values = dict.fromkeys(s.stage_values)
            s.reasons = {"S1-S5": why, "TASK": why, "AGENTIC": why, "OVERALL": why}
            s.combined = {"agentic": None, "overall": None, "agentic_reason": why, "task": None}
        else:
            r = s.rules
            s.combined = stages.combine(
                s.stage_values,
                s.grade.task_score,
                self.p.weights,
                r.null_policy,
                all_unscored=r.all_unscored,
                round_digits=r.round_digits,
            )
            if s.combined["agentic_reason"]:
                s.reasons["AGENTIC"] = s.combined["agentic_reason"]

    def _medal(self, s: Scoring) -> None:
        s.assessed = medal.assess(s.grade, s.traj.task, self.p.medals.get(s.track or ""), breach=s.breach)
        if s.assessed.reason and not s.breach:
            s.reasons["rating"] = s.assessed.reason

    def _codes(self, s: Scoring) -> None:
        """Error codes from the rules and, when the judge gives them, the judge's; suppressed for a
        valid submission with a good or okay medal where the profile says so."""
        s.fired = error_codes.detect(s.traj, None if s.breach else s.summary)
        judge_codes = getattr(self.judge, "codes", None)
        if judge_codes is not None and not s.no_data:
            found, why = judge_codes(s.traj, s.evidence)
            if why:
                s.reasons["codes"] = f"judge codes unscored: {why}"
            keys = ("code", "reason", "events")
            judged = [error_codes.Code(**{k: c[k] for k in keys}, source="judge") for c in found]
            s.fired = error_codes.merge(s.fired, judged)
        medal_ok = s.assessed.valid and s.assessed.medal in ("good", "okay")
        s.suppressed = self.p.codes.suppress_when_valid_and_okay and medal_ok and bool(s.fired)
        if s.suppressed:
            s.reasons["codes"] = f"suppressed: valid submission with medal {s.assessed.medal}"

    def _cost(self, s: Scoring) -> None:
        s.cost = msgspec.convert(price_run(s.traj, self.prices), Cost)
        if s.cost.cost_reason:
            s.reasons["cost"] = s.cost.cost_reason

    def _row(self, s: Scoring) -> ScoreRow:
        traj, audit, cost, p = s.traj, s.audit, s.cost, self.p
        return ScoreRow(
            run_id=traj.run_id,
            profile_id=self.loaded.id,
            profile_name=self.loaded.name,
            judge=self.judge.label,
            agent=traj.agent,
            model=traj.model,
            task=traj.task,
            track=s.track,
            tier=traj.tier,
            repeat=_repeat(traj.labels),
            s1=s.stage_values["S1"],
            s2=s.stage_values["S2"],
            s3=s.stage_values["S3"],
            s4=s.stage_values["S4"],
            s5=s.stage_values["S5"],
            agentic=s.combined["agentic"],
            task_score=s.combined["task"],
            overall=s.combined["overall"],
            status=_status(traj, audit.status, s.summary, p.budget.exceeded),
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
            codes=[] if s.suppressed else [c.code for c in s.fired],
            n_violations=len(audit.violations),
            reasons=s.reasons,
            details={
                "items": [msgspec.to_builtins(i) for i in s.scores],
                "codes": [{**msgspec.to_builtins(c), "suppressed": s.suppressed} for c in s.fired],
                "violations": [msgspec.to_builtins(v) for v in audit.violations],
                "grade": s.summary,
                "grade_key": s.grade_key,
                "cost_source": cost.cost_source,
            },
            evidence_sha256=s.evidence.sha256,
            fingerprint="",
            medal=s.assessed.medal,
            rating=s.assessed.rating,
        )


STAGES: tuple[Callable[[RunScorer, Scoring], None], ...] = (
    *(RunScorer._audit, RunScorer._grade, RunScorer._judge, RunScorer._stages),
    *(RunScorer._combine, RunScorer._medal, RunScorer._codes, RunScorer._cost),
)
"""The scoring stages, in order: each reads what the ones before it set."""


def fingerprint(row: ScoreRow) -> str:
    body = {k: v for k, v in row.as_dict().items() if k != "fingerprint"}
    return canonical_digest(body)


def _grade_facts(grade: dict[str, Any]) -> dict[str, Any]:
    keep = (
        *("metric", "n_cases", "n_missing", "n_invalid", "completion"),
        *("format_valid", "has_valid_results", "task_score", "reason"),
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
