"""Every task × tier: its synthetic twin graded against itself scores 1.0, an empty submission 0.

Parametrised over ``all_specs()``, so a task added under ``tasks/`` is covered without editing this
file. The tier changes only the brief, so each task's twin is generated once and graded per tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.task_spec import TIERS
from scorer.grader import grade
from scorer.grader.options import GradeOptions
from tasks import synth
from tasks.registry import all_specs, brief, load_spec

TASK_IDS = [s.id for s in all_specs()]
_twins: dict[str, Path] = {}


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """The task's synthetic twin and its perfect submission, generated once per task."""

    def get(task_id: str) -> Path:
        if task_id not in _twins:
            root = tmp_path_factory.mktemp(task_id)
            spec = load_spec(task_id)
            synth.synth(spec, root / "data", cases=3, seed=0)
            synth.perfect_submission(spec, root / "data", root / "perfect")
            (root / "empty").mkdir()
            _twins[task_id] = root
        return _twins[task_id]

    return get


def test_all_24_tasks_are_registered():
    assert len(TASK_IDS) == 24, TASK_IDS


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("task_id", TASK_IDS)
def test_perfect_submission_scores_one(task_id, tier, twin):
    assert brief(task_id, tier).strip()
    spec, root = load_spec(task_id), twin(task_id)
    result = grade(spec, root / "perfect", root / "data" / "private", GradeOptions())
    assert result.task == task_id and result.metric == spec.metric.name
    assert len(result.cases) == 3
    assert result.score == pytest.approx(1.0), [(c.case, c.score, c.reason) for c in result.cases]
    assert all(c.status == "scored" for c in result.cases), [(c.case, c.reason) for c in result.cases]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("task_id", TASK_IDS)
def test_empty_submission_scores_zero_with_reasons(task_id, tier, twin):
    assert brief(task_id, tier).strip()
    spec, root = load_spec(task_id), twin(task_id)
    result = grade(spec, root / "empty", root / "data" / "private", GradeOptions())
    assert result.score == 0.0
    assert len(result.cases) == 3
    for case in result.cases:
        assert case.score == 0.0
        assert case.status == "missing", (case.case, case.status, case.reason)
        assert case.reason and case.case in case.reason, case.reason
