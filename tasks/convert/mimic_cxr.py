"""MIMIC-CXR (reports) + MIMIC-CXR-JPG (images) → mimic-cxr-report.

Source layout (PhysioNet releases, merged under one folder as their shared ``files/`` tree):

- reports (``mimic-cxr-reports.zip``): ``files/pXX/pYYYYYYYY/sZZZZZZZZ.txt``, one free-text report per
  study;
- images (MIMIC-CXR-JPG): ``files/pXX/pYYYYYYYY/sZZZZZZZZ/<dicom_id>.jpg``, one JPEG per view;
- optional ``mimic-cxr-2.0.0-split.csv`` or ``.csv.gz`` (``dicom_id, study_id, subject_id, split``):
  when present only ``test`` studies are converted, as the benchmark's split is drawn from them.

A study becomes one case when it has a report with a non-empty FINDINGS section that itself passes
the task's validity rules, and at least one JPEG. The private reference is the FINDINGS section only
(the benchmark's ``findings_only`` mode); its IMPRESSION is dropped. Cases get neutral ids in study
order (``CXR0000`` ...) so the agent never sees MIMIC identifiers; the private manifest keeps the
mapping. Views are copied unchanged, in ``dicom_id`` order.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Callable
from pathlib import Path

from schemas.task_spec import TaskError, TaskSpec
from tasks.case_files import write_csv, write_report_case
from tasks.report_text import split_sections, submittable

_STUDY = re.compile(r"^s\d+$")


def _test_studies(source: Path) -> set[str] | None:
    for name in ("mimic-cxr-2.0.0-split.csv.gz", "mimic-cxr-2.0.0-split.csv"):
        path = next(iter(sorted(source.rglob(name))), None)
        if path is None:
            continue
        raw = path.read_bytes()
        if name.endswith(".gz"):
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as e:
                raise TaskError(f"{path}: not a readable gzip file: {e}") from e
        rows = csv.DictReader(io.StringIO(raw.decode("utf-8", errors="replace")))
        if not rows.fieldnames or not {"study_id", "split"} <= set(rows.fieldnames):
            raise TaskError(f"{path}: expected columns study_id and split")
        return {f"s{r['study_id']}" for r in rows if r.get("split") == "test"}
    return None


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    assert spec.report is not None
    source, out = Path(source), Path(out)
    wanted = _test_studies(source)
    files = source / "files"
    if not files.is_dir():
        raise TaskError(
            f"{source}: no files/ folder (expected MIMIC-CXR's files/pXX/pYYYYYYYY/sZZZZZZZZ.txt)"
        )
    # (study id, report path, sorted JPEG paths) of every study with both a report and images
    studies = []
    for report in sorted(files.glob("p*/p*/s*.txt")):
        if not _STUDY.match(report.stem):
            continue
        images = sorted(report.with_suffix("").glob("*.jpg"))
        if images:
            studies.append((report.stem, report, images))
    if not studies:
        raise TaskError(f"{source}: no study with both files/pXX/pY/sZ.txt and files/pXX/pY/sZ/*.jpg")
    studies = [s for s in studies if wanted is None or s[0] in wanted]
    index = 0
    rows = []
    for study, report, images in studies:
        text = report.read_bytes().decode("utf-8", errors="replace")
        findings = split_sections(text).get("findings", "")
        if not findings or not submittable(findings + "\n", spec.report):
            # The benchmark scores FINDINGS only: a study without them has no reference, and one
            # whose findings break the output rules (e.g. under 40 characters) could not be matched.
            continue
        case = spec.case_id(index)
        index += 1
        source_files = {
            "raw_study_id": study,
            "subject_id": report.parent.name,
            "source_report": str(report.relative_to(source)),
            "source_image_files": [p.name for p in images],
        }
        jpegs = [p.read_bytes() for p in images]
        write_report_case(out, spec, case, jpegs, findings, "findings_only", source_files)
        rows.append({"case_id": case, "raw_study_id": study, "image_count": len(images)})
        if progress is not None:
            progress(case)
    if not rows:
        raise TaskError(f"{source}: no study has a non-empty FINDINGS section")
    write_csv(out / "private" / "manifest.csv", rows)
