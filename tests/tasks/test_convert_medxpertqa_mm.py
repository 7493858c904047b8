"""MedXpertQA's download layout (MM/test.jsonl + images.zip) → the medxpertqa-mm task layout."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from schemas.task_spec import TaskError
from scorer.grader import grade
from tasks import convert, synth
from tasks.registry import load_spec


def _jpeg(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((12, 12), value, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _release(root: Path, lines: list[dict]) -> Path:
    (root / "MM").mkdir(parents=True)
    (root / "MM" / "test.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (root / "MM" / "dev.jsonl").write_text("")
    with zipfile.ZipFile(root / "images.zip", "w") as z:
        z.writestr("images/MM-0-a.jpeg", _jpeg(10))
        z.writestr("images/MM-1-a.jpeg", _jpeg(20))
        z.writestr("images/MM-1-b.jpeg", _jpeg(30))
    return root


OPTIONS = {
    "A": "Pneumothorax",
    "B": "Pleural effusion",
    "C": "Cardiomegaly",
    "D": "Atelectasis",
    "E": "Normal",
}
LINES = [
    {
        "id": "MM-0",
        "question": "A 60-year-old man ... What is shown?",
        "options": OPTIONS,
        "label": "B",
        "images": ["MM-0-a.jpeg"],
        "medical_task": "Diagnosis",
        "body_system": "Respiratory",
        "question_type": "Reasoning",
    },
    {
        "id": "MM-1",
        "question": "Two views ... Most likely diagnosis?",
        "options": OPTIONS,
        "label": "e",
        "images": ["MM-1-a.jpeg", "MM-1-b.jpeg"],
        "medical_task": "Diagnosis",
        "body_system": "Respiratory",
        "question_type": "Understanding",
    },
]


def test_converts_test_questions_from_the_zip(tmp_path):
    spec = load_spec("medxpertqa-mm")
    convert.prepare(spec, _release(tmp_path / "mxqa", LINES), tmp_path / "out")
    pub, priv = tmp_path / "out" / "public", tmp_path / "out" / "private"
    q = json.loads((pub / "MM-1" / "question.json").read_text())
    assert q["options"] == OPTIONS and q["image_paths"] == ["images/MM-1-a.jpeg", "images/MM-1-b.jpeg"]
    assert (pub / "MM-1" / "images" / "MM-1-b.jpeg").read_bytes() == _jpeg(30)
    gold = json.loads((priv / "MM-1" / "answer.json").read_text())
    assert (
        gold["answer_label"] == "E"
        and gold["answer_text"] == "Normal"
        and gold["answer_type"] == "multiple_choice"
    )
    synth.perfect_submission(spec, tmp_path / "out", tmp_path / "ws")
    assert grade(spec, tmp_path / "ws", priv).score == 1.0


def test_bad_records_are_clear_errors(tmp_path):
    spec = load_spec("medxpertqa-mm")
    bad = [dict(LINES[0], label="F")]
    with pytest.raises(TaskError, match="test.jsonl:1"):
        convert.prepare(spec, _release(tmp_path / "a", bad), tmp_path / "out")
    missing = [dict(LINES[0], images=["nope.jpeg"])]
    with pytest.raises(TaskError, match="nope.jpeg"):
        convert.prepare(spec, _release(tmp_path / "b", missing), tmp_path / "out2")
