"""VQA-RAD's OSF release layout → the vqa-rad task layout, on a tiny fixture built here."""

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


def _release(root: Path, records: list[dict], images: list[str]) -> Path:
    root.mkdir(parents=True)
    (root / "VQA_RAD Dataset Public.json").write_text(json.dumps(records))
    folder = root / "VQA_RAD Image Folder"
    folder.mkdir()
    for k, name in enumerate(images):
        Image.fromarray(np.full((16, 16), 40 * k, np.uint8)).save(folder / name, format="JPEG")
    return root


RECORDS = [
    {
        "qid": 1,
        "phrase_type": "freeform",
        "image_name": "synpic100.jpg",
        "question": "Is this a CT?",
        "answer": "yes",
        "answer_type": "CLOSED",
        "question_type": "MODALITY",
        "image_organ": "HEAD",
    },
    {
        "qid": 2,
        "phrase_type": "test_freeform",
        "image_name": "synpic100.jpg",
        "question": "Is there a mass?",
        "answer": "Yes",
        "answer_type": "CLOSED",
        "question_type": "PRES",
        "image_organ": "HEAD",
    },
    {
        "qid": 3,
        "phrase_type": "test_para",
        "image_name": "synpic200.jpg",
        "question": "Which side is the effusion on?",
        "answer": "right",
        "answer_type": "CLOSED",
        "question_type": "POS",
        "image_organ": "CHEST",
    },
    {
        "qid": 4,
        "phrase_type": "test_freeform",
        "image_name": "synpic200.jpg",
        "question": "How many ribs are fractured?",
        "answer": 2,
        "answer_type": "OPEN",
        "question_type": "COUNT",
        "image_organ": "CHEST",
    },
]


def test_converts_test_questions(tmp_path):
    spec = load_spec("vqa-rad")
    source = _release(tmp_path / "osf", RECORDS, ["synpic100.jpg", "synpic200.jpg"])
    done: list[str] = []
    convert.prepare(spec, source, tmp_path / "out", progress=done.append)
    pub, priv = tmp_path / "out" / "public", tmp_path / "out" / "private"
    assert sorted(p.name for p in pub.iterdir()) == [
        "vqarad_2",
        "vqarad_3",
        "vqarad_4",
    ]  # train qid 1 left out
    assert done == ["vqarad_2", "vqarad_3", "vqarad_4"]
    q = json.loads((pub / "vqarad_3" / "question.json").read_text())
    assert q["question"] == "Which side is the effusion on?" and q["question_type"] == "binary"
    assert q["body_system"] == "chest" and q["image_paths"] == ["images/vqarad_3-a.jpg"]
    assert (pub / "vqarad_3" / "images" / "vqarad_3-a.jpg").read_bytes() == (
        source / "VQA_RAD Image Folder" / "synpic200.jpg"
    ).read_bytes()
    golds = {p.parent.name: json.loads(p.read_text()) for p in priv.glob("*/answer.json")}
    assert golds["vqarad_2"]["answer_type"] == "yes/no"
    assert golds["vqarad_3"]["answer_type"] == "open"  # a closed question without a yes/no answer
    assert golds["vqarad_4"]["answer_text"] == "2"
    assert (priv / "ground_truth.csv").read_text().count("\n") == 4
    # the converted set grades like a twin: gold answers score 1.0
    synth.perfect_submission(spec, tmp_path / "out", tmp_path / "ws")
    assert grade(spec, tmp_path / "ws", priv).score == 1.0


def test_missing_image_and_missing_json_are_clear_errors(tmp_path):
    spec = load_spec("vqa-rad")
    source = _release(tmp_path / "osf", RECORDS, ["synpic100.jpg"])
    with pytest.raises(TaskError, match="synpic200.jpg"):
        convert.prepare(spec, source, tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TaskError, match="VQA-RAD question list"):
        convert.prepare(spec, empty, tmp_path / "out2")
