"""The grader: pure functions of a submission folder (laid out like the agent's workspace) and a data
set's ``private/`` folder. Each track's ``scorer.grader.<track>.grade_track`` reads only files (no
store, no network), so the same code runs on a laptop and inside the grader image."""

from __future__ import annotations

import importlib
from pathlib import Path

from schemas.errors import UsageError
from schemas.task_spec import TaskSpec
from scorer.grader.options import GradeOptions
from scorer.grader.result import CaseResult, GradeResult

__all__ = ["CaseResult", "GradeOptions", "GradeResult", "grade"]


def grade(
    spec: TaskSpec, submission: Path, reference: Path, options: GradeOptions | None = None
) -> GradeResult:
    submission, reference = Path(submission), Path(reference)
    if not submission.is_dir():
        raise UsageError(f"submission {submission}: not a directory")
    if not reference.is_dir():
        raise UsageError(f"reference {reference}: not a directory")
    try:
        module = importlib.import_module(f"scorer.grader.{spec.track}")
    except ModuleNotFoundError as e:
        if e.name != f"scorer.grader.{spec.track}":
            raise
        raise UsageError(f"task {spec.id}: no grader for track {spec.track!r} yet") from e
    return module.grade_track(spec, submission, reference, options or GradeOptions())
