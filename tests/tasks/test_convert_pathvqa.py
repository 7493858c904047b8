"""PathVQA's Hugging Face parquet layout (data/test-*.parquet) → the pathvqa task layout."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from schemas.task_spec import TaskError
from scorer.grader import grade
from tasks import convert, synth
from tasks.registry import load_spec


def _image(fmt: str, value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((10, 10, 3), value, np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def _release(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for name, rows in (
        (
            "test-00000-of-00001.parquet",
            [
                (_image("JPEG", 10), "Is there necrosis?", "yes"),
                (_image("PNG", 20), "What is present?", "granuloma"),
            ],
        ),
        ("train-00000-of-00001.parquet", [(_image("JPEG", 30), "Train question?", "no")]),
    ):
        table = pa.table(
            {
                "image": pa.array([{"bytes": b, "path": None} for b, _, _ in rows], type=image_type),
                "question": [q for _, q, _ in rows],
                "answer": [a for _, _, a in rows],
            }
        )
        pq.write_table(table, root / "data" / name)
    return root


def test_converts_test_rows(tmp_path):
    spec = load_spec("pathvqa")
    convert.prepare(spec, _release(tmp_path / "path-vqa"), tmp_path / "out")
    pub, priv = tmp_path / "out" / "public", tmp_path / "out" / "private"
    assert sorted(p.name for p in pub.iterdir()) == ["pathvqa_00000", "pathvqa_00001"]
    q = json.loads((pub / "pathvqa_00001" / "question.json").read_text())
    assert q["image_paths"] == ["images/pathvqa_00001-a.png"] and q["question"] == "What is present?"
    assert (pub / "pathvqa_00001" / "images" / "pathvqa_00001-a.png").read_bytes() == _image("PNG", 20)
    assert json.loads((priv / "pathvqa_00000" / "answer.json").read_text())["answer_type"] == "yes/no"
    synth.perfect_submission(spec, tmp_path / "out", tmp_path / "ws")
    assert grade(spec, tmp_path / "ws", priv).score == 1.0


def test_no_parquet_is_a_clear_error(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(TaskError, match="test-\\*.parquet"):
        convert.prepare(load_spec("pathvqa"), tmp_path / "src", tmp_path / "out")
