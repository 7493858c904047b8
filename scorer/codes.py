"""Error codes E1–E5 (the paper's Table 6): multi-label, diagnostic only, each citing its events.

Codes never change a score; they explain one. Deterministic detectors (E2–E5, docs/scoring.md) fire
where the record is objective; E1 is a judgment, so it comes only from the LLM judge
(``judge_codes``), whose codes also cite events.
"""

from __future__ import annotations

from typing import Any

import msgspec

from scorer.signals import bulk_index, output_root, pilot_evidence, setup_failures, traceback_execs
from scorer.trajectory import Trajectory


class Code(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    reason: str
    events: list[str]
    source: str = "rules"
    """``rules`` (a deterministic detector) or ``judge`` (the LLM judge)."""


def detect(traj: Trajectory, grade: dict[str, Any] | None) -> list[Code]:
    out: list[Code] = []

    def fire(code: str, reason: str, events: list[str]) -> None:
        out.append(Code(code=code, reason=reason, events=events))

    roots = output_root(traj)
    end = [traj.finished_id] if traj.finished_id else []
    g = grade or {}
    graded = g.get("task_score") is not None
    if traj.submission is None:
        fire("E5", "no submission was sealed", end)
    else:
        outputs = [f.path for f in traj.submission.files if roots.is_output(f.path)]
        seal = [traj.submission_id] if traj.submission_id else []
        if not outputs:
            fire("E5", "the sealed submission has no output files", seal)
        elif graded and (g.get("n_missing") or g.get("n_invalid")):
            n_missing, n_invalid = g.get("n_missing", 0), g.get("n_invalid", 0)
            fire("E5", f"{n_missing} missing and {n_invalid} malformed cases of {g.get('n_cases')}", seal)

    setup = setup_failures(traj)
    if len(setup) >= 2:
        fire("E2", f"{len(setup)} failed install/load attempts", [e.id for e in setup][:10])
    setup_ids = {e.id for e in setup}
    if tb := [e for e in traceback_execs(traj) if e.id not in setup_ids]:
        fire("E4", f"{len(tb)} executions ended in a traceback", [e.id for e in tb][:10])

    value, why, ids = pilot_evidence(traj, roots)
    if value == 0.0 and bulk_index(traj, roots) is not None:
        fire("E3", why, ids)
    elif (
        graded
        and traj.status == "completed"
        and g.get("n_cases")
        and not g.get("has_valid_results")
        and g.get("n_missing", 0) < g["n_cases"]
    ):
        seal_or_end = [traj.submission_id] if traj.submission_id else end
        fire("E3", "outputs that all score 0 were accepted and submitted", seal_or_end)
    return sorted(out, key=lambda c: c.code)


def merge(rules: list[Code], judged: list[Code]) -> list[Code]:
    """Rule codes plus judge codes for codes the rules did not fire (one entry per code)."""
    have = {c.code for c in rules}
    return sorted(rules + [c for c in judged if c.code not in have], key=lambda c: c.code)
