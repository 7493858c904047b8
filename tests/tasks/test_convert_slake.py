"""SLAKE 1.0's layout (test.json + imgs/xmlab<N>/source.jpg) → the slake task layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from schemas.task_spec import TaskError
from scorer.grader import grade
from tasks import convert, synth
from tasks.registry import load_spec


def _release(root: Path) -> Path:
    for k in (1, 2):
        (root / "imgs" / f"xmlab{k}").mkdir(parents=True)
        Image.fromarray(np.full((16, 16), 60 * k, np.uint8)).save(root / "imgs" / f"xmlab{k}" / "source.jpg")
    records = [
        {
            "qid": 11,
            "img_name": "xmlab1/source.jpg",
            "question": "Which organ is abnormal?",
            "answer": "Liver",
            "q_lang": "en",
            "answer_type": "OPEN",
            "location": "Abdomen",
            "modality": "CT",
            "content_type": "Organ",
        },
        {
            "qid": 12,
            "img_name": "xmlab1/source.jpg",
            "question": "哪个器官不正常?",
            "answer": "肝脏",
            "q_lang": "zh",
            "answer_type": "OPEN",
            "location": "Abdomen",
            "modality": "CT",
            "content_type": "Organ",
        },
        {
            "qid": 13,
            "img_name": "xmlab2/source.jpg",
            "question": "Is this an MRI?",
            "answer": "No",
            "q_lang": "en",
            "answer_type": "CLOSED",
            "location": "Brain",
            "modality": "CT",
            "content_type": "Modality",
        },
    ]
    (root / "test.json").write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    (root / "train.json").write_text("[]")
    return root


def test_converts_english_test_questions(tmp_path):
    spec = load_spec("slake")
    source = _release(tmp_path / "Slake1.0")
    convert.prepare(spec, source, tmp_path / "out")
    pub, priv = tmp_path / "out" / "public", tmp_path / "out" / "private"
    assert sorted(p.name for p in pub.iterdir()) == ["slake_11", "slake_13"]
    q = json.loads((pub / "slake_13" / "question.json").read_text())
    assert q["dataset"] == "SLAKE-EN" and q["body_system"] == "brain" and q["question_type"] == "binary"
    assert (pub / "slake_13" / q["image_paths"][0]).read_bytes() == (
        source / "imgs/xmlab2/source.jpg"
    ).read_bytes()
    gold = json.loads((priv / "slake_13" / "answer.json").read_text())
    assert gold["answer_type"] == "yes/no" and gold["answer_text"] == "No"
    synth.perfect_submission(spec, tmp_path / "out", tmp_path / "ws")
    assert grade(spec, tmp_path / "ws", priv).score == 1.0


def test_missing_test_json_is_a_clear_error(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(TaskError, match="test.json"):
        convert.prepare(load_spec("slake"), tmp_path / "src", tmp_path / "out")
