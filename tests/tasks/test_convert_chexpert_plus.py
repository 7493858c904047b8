"""CheXpert Plus's layout (df_chexpert_plus_240401.csv + PNG/ images) → the chexpert-plus-cxr layout."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from schemas.task_spec import TaskError
from scorer.grader import grade
from tasks import convert, synth
from tasks.registry import load_spec

COLUMNS = [
    "path_to_image",
    "path_to_dcm",
    "frontal_lateral",
    "ap_pa",
    "split",
    "section_findings",
    "section_impression",
    "section_history",
]


def _release(root: Path) -> Path:
    rows = [
        [
            "valid/patient1/study1/view1_frontal.jpg",
            "",
            "Frontal",
            "PA",
            "valid",
            "Heart size is normal.\nNo pleural effusion.",
            "No acute process.",
            "cough",
        ],
        [
            "valid/patient1/study1/view2_lateral.jpg",
            "",
            "Lateral",
            "",
            "valid",
            "Heart size is normal.\nNo pleural effusion.",
            "No acute process.",
            "cough",
        ],
        [
            "valid/patient2/study1/view1_frontal.jpg",
            "",
            "Frontal",
            "AP",
            "valid",
            "",
            "Small left pleural effusion, otherwise unchanged.",
            "",
        ],
        # 31 characters of reference: under the 40 a submission needs, so the study is left out
        [
            "valid/patient4/study1/view1_frontal.jpg",
            "",
            "Frontal",
            "AP",
            "valid",
            "",
            "Small left effusion.",
            "",
        ],
        [
            "valid/patient3/study2/view1_frontal.jpg",
            "",
            "Frontal",
            "AP",
            "valid",
            "",
            "",
            "",
        ],  # no report text
        ["train/patient9/study1/view1_frontal.jpg", "", "Frontal", "PA", "train", "Clear.", "Normal.", ""],
    ]
    root.mkdir(parents=True)
    with open(root / "df_chexpert_plus_240401.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    for k, row in enumerate(rows):
        png = root / "PNG" / Path(row[0]).with_suffix(".png")
        png.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((24, 24), 30 * k, np.uint8)).save(png)
    return root


def test_converts_valid_frontal_studies(tmp_path):
    spec = load_spec("chexpert-plus-cxr")
    convert.prepare(spec, _release(tmp_path / "chexpert"), tmp_path / "out")
    pub, priv = tmp_path / "out" / "public", tmp_path / "out" / "private"
    assert sorted(p.name for p in pub.iterdir()) == ["study_0000", "study_0001"]
    with Image.open(pub / "study_0000" / "images" / "01.jpg") as im:
        assert im.format == "JPEG"
    assert (
        priv / "study_0000" / "report.txt"
    ).read_text() == "FINDINGS: Heart size is normal. No pleural effusion.\n\nIMPRESSION: No acute process.\n"
    assert (
        priv / "study_0001" / "report.txt"
    ).read_text() == "IMPRESSION: Small left pleural effusion, otherwise unchanged.\n"
    assert (
        json.loads((priv / "study_0000" / "manifest.json").read_text())["source_study"]
        == "valid/patient1/study1"
    )
    synth.perfect_submission(spec, tmp_path / "out", tmp_path / "ws")
    assert grade(spec, tmp_path / "ws", priv).score == pytest.approx(1.0)


def test_missing_table_is_a_clear_error(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(TaskError, match="df_chexpert_plus"):
        convert.prepare(load_spec("chexpert-plus-cxr"), tmp_path / "src", tmp_path / "out")
