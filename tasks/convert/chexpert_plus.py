"""CheXpert Plus → chexpert-plus-cxr.

Source layout (the Stanford AIMI release): ``df_chexpert_plus_240401.csv`` (any
``df_chexpert_plus*.csv``) with one row per image: ``path_to_image``
(``train/patient42142/study5/view1_frontal.jpg``), ``frontal_lateral`` (``Frontal``/``Lateral``),
``split`` (``train``/``valid``), ``section_findings``, ``section_impression``, ...; and the images
below the source under that relative path, as ``.jpg`` or as the release's ``PNG/`` copies
(``PNG/train/patient42142/study5/view1_frontal.png``).

One case per study: its first frontal image and its report. Rows of the ``valid`` split are used when
the CSV has a ``split`` column (the held-out part of the release); a study needs a findings or an
impression section, and its reference must pass the task's validity rules (a perfect agent must be
able to hand it in). The reference is ``FINDINGS: ...`` and ``IMPRESSION: ...`` (the task scores the
full report). PNG images are re-encoded as greyscale JPEG (quality 95); JPEGs are copied unchanged.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from schemas.task_spec import TaskError, TaskSpec
from tasks.case_files import grey_jpeg, write_report_case
from tasks.report_text import submittable

csv.field_size_limit(1 << 24)


def _image(source: Path, rel: str) -> tuple[Path, bool] | None:
    """The image file for ``path_to_image`` and whether it must be re-encoded (PNG)."""
    rel_path = Path(rel)
    for candidate in (
        source / rel_path,
        source / "PNG" / rel_path.with_suffix(".png"),
        source / rel_path.with_suffix(".png"),
    ):
        if candidate.is_file():
            return candidate, candidate.suffix.lower() == ".png"
    return None


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    assert spec.report is not None
    source, out = Path(source), Path(out)
    tables = sorted(source.rglob("df_chexpert_plus*.csv"))
    if not tables:
        raise TaskError(f"{source}: no df_chexpert_plus*.csv found (the CheXpert Plus report table)")
    table = tables[0]
    with open(table, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "path_to_image" not in rows[0]:
        raise TaskError(f"{table}: expected a path_to_image column")
    if "split" in rows[0]:
        rows = [r for r in rows if r.get("split") == "valid"]
    studies: dict[str, dict[str, str]] = {}
    for r in rows:
        path = r["path_to_image"]
        frontal = (r.get("frontal_lateral") or "").lower() == "frontal" or "frontal" in path.lower()
        study = str(Path(path).parent)
        if frontal and study not in studies:
            studies[study] = r
    index = 0
    for study, r in sorted(studies.items()):
        findings = " ".join((r.get("section_findings") or "").split())
        impression = " ".join((r.get("section_impression") or "").split())
        parts = [
            f"{name}: {text}" for name, text in (("FINDINGS", findings), ("IMPRESSION", impression)) if text
        ]
        reference = "\n\n".join(parts)
        if not parts or not submittable(reference + "\n", spec.report):
            continue  # no report text, or one shorter than the 40 characters a submission needs
        found = _image(source, r["path_to_image"])
        if found is None:
            continue
        image, reencode = found
        case = spec.case_id(index)
        index += 1
        jpeg = grey_jpeg(image) if reencode else image.read_bytes()
        source_files = {"source_study": study, "source_image": r["path_to_image"]}
        write_report_case(out, spec, case, [jpeg], reference, "full_report", source_files)
        if progress is not None:
            progress(case)
    if index == 0:
        raise TaskError(
            f"{source}: no study with a frontal image on disk and a findings or impression section"
        )
