"""MIMIC-CXR's files/pXX/pYYYYYYYY/sZZZZZZZZ layout → the mimic-cxr-report task layout."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from schemas.task_spec import TaskError
from scorer.grader import grade
from scorer.grader.options import GradeOptions
from tasks import convert, synth
from tasks.registry import load_spec

REPORT = """                                 FINAL REPORT
 EXAMINATION:  CHEST (PA AND LAT)

 INDICATION:  ___ year old woman with cough.

 FINDINGS:

 Small left pleural effusion.  No pneumothorax.  The cardiac silhouette is
 mildly enlarged.

 IMPRESSION:

 Small left effusion.
"""
NO_FINDINGS = """                                 FINAL REPORT
 INDICATION:  line placement.

 IMPRESSION:  Right IJ line ends in the SVC.
"""


def _jpeg(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((20, 24), value, np.uint8)).save(path, format="JPEG")


def _release(root: Path, split: dict[str, str] | None = None) -> Path:
    files = root / "files" / "p10"
    (files / "p10000032").mkdir(parents=True)
    (files / "p10000032" / "s50414267.txt").write_text(REPORT)
    _jpeg(files / "p10000032" / "s50414267" / "bbb.jpg", 10)
    _jpeg(files / "p10000032" / "s50414267" / "aaa.jpg", 20)
    (files / "p10000032" / "s53189527.txt").write_text(NO_FINDINGS)
    _jpeg(files / "p10000032" / "s53189527" / "ccc.jpg", 30)
    (files / "p10000764").mkdir()
    (files / "p10000764" / "s57375967.txt").write_text(REPORT.replace("left", "right"))
    _jpeg(files / "p10000764" / "s57375967" / "ddd.jpg", 40)
    (files / "p10000764" / "s59999999.txt").write_text(REPORT)  # a report without images
    # findings shorter than the 40 characters a submission needs: no agent could match them
    (files / "p10000764" / "s58888888.txt").write_text(" FINDINGS: Clear.\n\n IMPRESSION: Normal.\n")
    _jpeg(files / "p10000764" / "s58888888" / "eee.jpg", 50)
    if split is not None:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["dicom_id", "study_id", "subject_id", "split"])
        for study, which in split.items():
            writer.writerow(["x", study.removeprefix("s"), "10000032", which])
        (root / "mimic-cxr-2.0.0-split.csv.gz").write_bytes(gzip.compress(buf.getvalue().encode()))
    return root


def test_converts_studies_with_findings(tmp_path):
    spec = load_spec("mimic-cxr-report")
    done: list[str] = []
    convert.prepare(spec, _release(tmp_path / "mimic"), tmp_path / "out", progress=done.append)
    pub, priv = tmp_path / "out" / "public", tmp_path / "out" / "private"
    assert sorted(p.name for p in pub.iterdir()) == done == ["CXR0000", "CXR0001"]
    manifest = json.loads((pub / "CXR0000" / "manifest.json").read_text())
    assert manifest["image_files"] == ["01.jpg", "02.jpg"]
    # views in dicom_id order, bytes unchanged
    assert (pub / "CXR0000" / "images" / "01.jpg").read_bytes() == (
        tmp_path / "mimic/files/p10/p10000032/s50414267/aaa.jpg"
    ).read_bytes()
    ref = (priv / "CXR0000" / "report.txt").read_text()
    assert (
        ref.startswith("Small left pleural effusion.") and "IMPRESSION" not in ref and "INDICATION" not in ref
    )
    assert json.loads((priv / "CXR0001" / "manifest.json").read_text())["raw_study_id"] == "s57375967"
    assert "s5" not in json.dumps(manifest)  # no MIMIC identifiers on the public side
    synth.perfect_submission(spec, tmp_path / "out", tmp_path / "ws")
    assert grade(spec, tmp_path / "ws", priv, GradeOptions(text_level="corpus")).score == pytest.approx(1.0)


def test_official_split_keeps_test_studies_only(tmp_path):
    spec = load_spec("mimic-cxr-report")
    source = _release(tmp_path / "mimic", split={"s50414267": "train", "s57375967": "test"})
    convert.prepare(spec, source, tmp_path / "out")
    cases = sorted((tmp_path / "out" / "private").glob("*/manifest.json"))
    assert [json.loads(p.read_text())["raw_study_id"] for p in cases] == ["s57375967"]


def test_wrong_layout_is_a_clear_error(tmp_path):
    spec = load_spec("mimic-cxr-report")
    (tmp_path / "src").mkdir()
    with pytest.raises(TaskError, match="files/"):
        convert.prepare(spec, tmp_path / "src", tmp_path / "out")
