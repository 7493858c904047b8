"""Where outputs live comes from each task's submission contract, not from one folder name."""

from __future__ import annotations

import pytest

from scorer.signals import output_root
from scorer.trajectory import Trajectory


@pytest.mark.parametrize(
    "task, path, case",
    [
        ("vqa-rad", "q0007/answer.json", "q0007"),
        ("vqa-rad", "./q0007/answer.json", "q0007"),
        ("vqa-rad", "/workspace/q0007/answer.json", "q0007"),
        ("vqa-rad", "plan/plan.md", None),
        ("vqa-rad", "q0007/notes.txt", None),
        ("kidney-seg", "agents_outputs/case_00003/organ.nii.gz", "case_00003"),
        ("kidney-seg", "agents_outputs/agents_decision.csv", None),
        ("mimic-cxr-report", "agent_outputs/s5001/report.txt", "s5001"),
        ("bccd-det", "agents_outputs/BloodImage_001/prediction.json", "BloodImage_001"),
        (None, "agents_outputs/c1/whatever.bin", "c1"),
        ("no-such-task", "agent_outputs/c2/x", "c2"),
    ],
)
def test_case_of(task, path, case):
    outputs = output_root(Trajectory(run_id="r", task=task, workspace="/workspace"))
    assert outputs.case_of(path) == case


def test_code_handling_outputs_is_recognised():
    vqa = output_root(Trajectory(run_id="r", task="vqa-rad"))
    assert vqa.mentioned_in("json.load(open(f'{qid}/answer.json'))")
    assert not vqa.mentioned_in("print('hello')")
    seg = output_root(Trajectory(run_id="r", task="kidney-seg"))
    assert seg.mentioned_in("nib.load('agents_outputs/c/organ.nii.gz').shape")
