"""IU X-Ray's Open-i layout (ecgen-radiology XML + NLMCXR_png) → the iu-xray-report task layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from schemas.task_spec import TaskError
from tasks import convert
from tasks.registry import load_spec


def _xml(findings: str, impression: str, images: list[str]) -> str:
    parents = "".join(f'<parentImage id="{i}"><url>/x/{i}.jpg</url></parentImage>' for i in images)
    return (
        f'<?xml version="1.0" encoding="utf-8"?><eCitation><MedlineCitation><Article><Abstract>'
        f'<AbstractText Label="COMPARISON">None.</AbstractText>'
        f'<AbstractText Label="INDICATION">XXXX-year-old male, chest pain.</AbstractText>'
        f'<AbstractText Label="FINDINGS">{findings}</AbstractText>'
        f'<AbstractText Label="IMPRESSION">{impression}</AbstractText>'
        f"</Abstract></Article></MedlineCitation>{parents}</eCitation>"
    )


def _release(root: Path) -> Path:
    reports, pngs = root / "ecgen-radiology", root / "NLMCXR_png"
    reports.mkdir(parents=True)
    pngs.mkdir()
    (reports / "1.xml").write_text(
        _xml(
            "The cardiac silhouette and mediastinum size are within normal limits. "
            "There is no pulmonary edema.",
            "Normal chest x-XXXX.",
            ["CXR1_1_IM-0001-3001", "CXR1_1_IM-0001-4001"],
        )
    )
    (reports / "2.xml").write_text(_xml("", "No acute disease.", ["CXR2_IM-0652-1001"]))  # no findings
    (reports / "10.xml").write_text(_xml("Heart size normal. Lungs are clear.", "", ["CXR10_IM-0002-1001"]))
    for k, name in enumerate(
        ["CXR1_1_IM-0001-3001", "CXR1_1_IM-0001-4001", "CXR2_IM-0652-1001", "CXR10_IM-0002-1001"]
    ):
        Image.fromarray(np.full((20, 20), 50 + k, np.uint8)).save(pngs / f"{name}.png")
    return root


def test_converts_reports_with_findings(tmp_path):
    spec = load_spec("iu-xray-report")
    convert.prepare(spec, _release(tmp_path / "openi"), tmp_path / "out")
    pub, priv = tmp_path / "out" / "public", tmp_path / "out" / "private"
    assert sorted(p.name for p in pub.iterdir()) == ["IU0000", "IU0001"]
    assert json.loads((pub / "IU0000" / "manifest.json").read_text())["image_count"] == 2
    with Image.open(pub / "IU0000" / "images" / "02.jpg") as im:
        assert im.format == "JPEG" and im.mode == "L"
    ref = (priv / "IU0000" / "report.txt").read_text()
    assert ref.startswith("FINDINGS: The cardiac silhouette") and "IMPRESSION: Normal chest x-XXXX." in ref
    assert (priv / "IU0001" / "report.txt").read_text() == "FINDINGS: Heart size normal. Lungs are clear.\n"
    assert json.loads((priv / "IU0001" / "manifest.json").read_text())["source_report"] == "10.xml"


def test_no_reports_is_a_clear_error(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(TaskError, match="ecgen-radiology"):
        convert.prepare(load_spec("iu-xray-report"), tmp_path / "src", tmp_path / "out")
