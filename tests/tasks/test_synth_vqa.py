"""The VQA twins: the benchmark's layout, answerable questions of every kind, no leaked answers,
determinism per seed."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from tasks import synth
from tasks.registry import load_spec
from tests.tasks.helpers import twin_is_deterministic

VQA_TASKS = ["vqa-rad", "pathvqa", "slake", "medxpertqa-mm", "medframeqa"]


@pytest.mark.parametrize("task_id", VQA_TASKS)
def test_layout_and_contents(task_id, tmp_path):
    spec = load_spec(task_id)
    synth.synth(spec, tmp_path, cases=6, seed=1)
    public, private = tmp_path / "public", tmp_path / "private"
    qids = sorted(p.name for p in public.iterdir())
    assert qids == [spec.case_id(i) for i in range(6)]
    assert (private / "ground_truth.csv").read_text().count("\n") == 7
    kinds = set()
    for qid in qids:
        q = json.loads((public / qid / "question.json").read_text())
        gold = json.loads((private / qid / "answer.json").read_text())
        assert q["question_id"] == gold["question_id"] == qid
        assert {
            "dataset",
            "question",
            "image_paths",
            "split",
            "medical_task",
            "body_system",
            "question_type",
        } <= set(q)
        # nothing of the answer reaches the public side
        assert not {"answer", "answer_text", "answer_label", "reference_answer"} & set(q)
        for rel in q["image_paths"]:
            with Image.open(public / qid / rel) as im:
                assert im.format == "JPEG" and im.size == (128, 128)
        n_images = len(q["image_paths"])
        assert spec.vqa is not None
        lo, hi = spec.vqa.frames
        assert lo <= n_images <= hi
        kinds.add(gold["answer_type"])
        if spec.vqa.answer_mode == "multiple_choice":
            assert sorted(q["options"]) == ["A", "B", "C", "D", "E"]
            assert q["options"][gold["answer_label"]] == gold["answer_text"]
        else:
            assert gold["answer_label"] == "" and gold["answer_text"]
    assert spec.vqa is not None
    if spec.vqa.answer_mode == "multiple_choice":
        assert kinds == {"multiple_choice"}
    else:
        assert kinds == {"yes/no", "open"}


def test_multi_frame_questions_have_two_to_five_frames(tmp_path):
    spec = load_spec("medframeqa")
    synth.synth(spec, tmp_path, cases=12, seed=4)
    counts = {
        len(json.loads(p.read_text())["image_paths"]) for p in (tmp_path / "public").glob("*/question.json")
    }
    assert counts <= {2, 3, 4, 5} and len(counts) >= 2


@pytest.mark.parametrize("task_id", ["vqa-rad", "medxpertqa-mm"])
def test_deterministic_per_seed(task_id, tmp_path):
    twin_is_deterministic(load_spec(task_id), tmp_path, 4, 7)


def test_perfect_submission_is_shaped_like_submit_answer(tmp_path):
    spec = load_spec("slake")
    synth.synth(spec, tmp_path / "data", cases=3, seed=0)
    synth.perfect_submission(spec, tmp_path / "data", tmp_path / "ws")
    for path in (tmp_path / "ws").glob("*/answer.json"):
        record = json.loads(path.read_text())
        assert set(record) == {
            "question_id",
            "predicted_label",
            "predicted_answer",
            "raw_model_output",
            "model_name",
            "runtime_s",
        }
        assert record["question_id"] == path.parent.name
    assert len(list((tmp_path / "ws").glob("*/answer.json"))) == 3
