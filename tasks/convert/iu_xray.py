"""IU X-Ray (Open-i) → iu-xray-report.

Source layout (the Open-i downloads ``NLMCXR_reports.tgz`` and ``NLMCXR_png.tgz``, unpacked side by
side): ``ecgen-radiology/<n>.xml``, one report per study with ``<AbstractText Label="FINDINGS">``,
``<AbstractText Label="IMPRESSION">`` and one ``<parentImage id="CXR<n>_...">`` per view; and
``NLMCXR_png/<parentImage id>.png`` (any folder below the source is searched for the PNGs).

A study becomes one case when its FINDINGS text is non-empty, at least one of its images exists and
the reference passes the task's validity rules (a perfect agent must be able to hand it in).
The reference is ``FINDINGS: ...`` followed by ``IMPRESSION: ...`` when there is one (the task scores
the whole text). The PNG views are re-encoded as baseline JPEG (quality 95, greyscale), since the
benchmark hands the agent JPEGs; ``XXXX`` de-identification tokens are kept as they are.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from schemas.task_spec import TaskError, TaskSpec
from tasks.case_files import grey_jpeg, write_report_case
from tasks.report_text import submittable


def _text(root: ET.Element, label: str) -> str:
    for node in root.iter("AbstractText"):
        if (node.get("Label") or "").upper() == label:
            return " ".join("".join(node.itertext()).split())
    return ""


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    assert spec.report is not None
    source, out = Path(source), Path(out)
    reports = sorted(source.rglob("ecgen-radiology/*.xml"), key=lambda p: (len(p.stem), p.stem))
    if not reports:
        raise TaskError(f"{source}: no ecgen-radiology/*.xml found (unpack Open-i's NLMCXR_reports.tgz here)")
    pngs = {p.stem: p for p in source.rglob("*.png")}
    index = 0
    for xml_path in reports:
        try:
            root = ET.parse(xml_path).getroot()
        except ET.ParseError as e:
            raise TaskError(f"{xml_path}: not readable XML: {e}") from e
        findings, impression = _text(root, "FINDINGS"), _text(root, "IMPRESSION")
        views = [pngs[i] for i in (n.get("id", "") for n in root.iter("parentImage")) if i in pngs]
        reference = f"FINDINGS: {findings}" + (f"\n\nIMPRESSION: {impression}" if impression else "")
        if not findings or not views or not submittable(reference + "\n", spec.report):
            continue
        case = spec.case_id(index)
        index += 1
        source_files = {"source_report": xml_path.name, "source_images": [p.name for p in views]}
        jpegs = [grey_jpeg(png) for png in views]
        write_report_case(out, spec, case, jpegs, reference, "full_report", source_files)
        if progress is not None:
            progress(case)
    if index == 0:
        raise TaskError(f"{source}: no report has both FINDINGS text and an image found under the source")
