"""Error codes E1–E5 (the paper's Table 6): multi-label, diagnostic only, each citing its events.

Codes never change a score; they explain one. Deterministic detectors fire where the record is
objective; the LLM judge may add codes (``judge_codes``), also with cited events. Detectors:

- E5 deliverable: nothing sealed, no output under the submission root, or the grader found missing
  or malformed cases (cites the seal and the run end).
- E2 setup: two or more executions failed on installing or loading packages, checkpoints or the GPU.
- E4 execution: an execution died with a traceback that is not a setup failure.
- E3 verification: bulk inference without any pilot check (S3 signal 0 with a bulk run), or
  implausible outputs accepted (the run completed and sealed outputs that all score 0).
- E1 understanding: no deterministic detector (the paper's E1 is a judgment); only from the judge.
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
    roots = output_root(traj)
    end = [traj.finished_id] if traj.finished_id else []

    if traj.submission is None:
        out.append(Code(code="E5", reason="no submission was sealed", events=end))
    else:
        outputs = [f.path for f in traj.submission.files if roots.is_output(f.path)]
        seal = [traj.submission_id] if traj.submission_id else []
        if not outputs:
            out.append(Code(code="E5", reason="the sealed submission has no output files", events=seal))
        elif (
            grade
            and grade.get("task_score") is not None
            and (grade.get("n_missing") or grade.get("n_invalid"))
        ):
            out.append(
                Code(
                    code="E5",
                    reason=(
                        f"{grade.get('n_missing', 0)} missing and {grade.get('n_invalid', 0)} malformed "
                        f"cases of {grade.get('n_cases')}"
                    ),
                    events=seal,
                )
            )

    setup = setup_failures(traj)
    if len(setup) >= 2:
        out.append(
            Code(
                code="E2",
                reason=f"{len(setup)} failed install/load attempts",
                events=[e.id for e in setup][:10],
            )
        )

    setup_ids = {e.id for e in setup}
    tb = [e for e in traceback_execs(traj) if e.id not in setup_ids]
    if tb:
        out.append(
            Code(
                code="E4", reason=f"{len(tb)} executions ended in a traceback", events=[e.id for e in tb][:10]
            )
        )

    value, why, ids = pilot_evidence(traj, roots)
    if value == 0.0 and bulk_index(traj, roots) is not None:
        out.append(Code(code="E3", reason=why, events=ids))
    elif (
        grade
        and grade.get("task_score") is not None
        and traj.status == "completed"
        and grade.get("n_cases")
        and not grade.get("has_valid_results")
        and grade.get("n_missing", 0) < grade["n_cases"]
    ):
        out.append(
            Code(
                code="E3",
                reason="outputs that all score 0 were accepted and submitted",
                events=[traj.submission_id] if traj.submission_id else end,
            )
        )
    return sorted(out, key=lambda c: c.code)


def merge(rules: list[Code], judged: list[Code]) -> list[Code]:
    """Rule codes plus judge codes for codes the rules did not fire (one entry per code)."""
    have = {c.code for c in rules}
    return sorted(rules + [c for c in judged if c.code not in have], key=lambda c: c.code)
