"""The report-generation twins: the benchmark's layout, references that pass the task's own
validity rules, sections where the task has them, text that agrees with the drawn image,
determinism per seed."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from scorer.metrics import chexpert_rules, text
from tasks import synth
from tasks.registry import load_spec
from tests.tasks.helpers import twin_is_deterministic

REPORT_TASKS = [
    "iu-xray-report",
    "mimic-cxr-report",
    "pathology-caption-100",
    "pathology-caption-500",
    "chexpert-plus-cxr",
]


@pytest.mark.parametrize("task_id", REPORT_TASKS)
def test_layout_and_valid_references(task_id, tmp_path):
    spec = load_spec(task_id)
    synth.synth(spec, tmp_path, cases=5, seed=2)
    assert spec.report is not None
    rules = text.Validity(
        min_chars=spec.report.min_chars,
        max_chars=spec.report.max_chars,
        min_letters=spec.report.min_letters,
        printable_ascii=spec.report.printable_ascii,
    )
    cases = sorted(p.name for p in (tmp_path / "public").iterdir())
    assert cases == [spec.case_id(i) for i in range(5)]
    for case in cases:
        manifest = json.loads((tmp_path / "public" / case / "manifest.json").read_text())
        assert manifest["case_id"] == case and manifest["image_count"] == len(manifest["image_files"])
        lo, hi = spec.report.views
        assert lo <= manifest["image_count"] <= hi
        for name in manifest["image_files"]:
            with Image.open(tmp_path / "public" / case / "images" / name) as im:
                assert im.format == "JPEG"
                assert im.mode == ("RGB" if spec.report.style == "pathology" else "L")
        assert not (tmp_path / "public" / case / "report.txt").exists()
        ref = (tmp_path / "private" / case / "report.txt").read_text()
        assert text.validity_errors(ref, rules) == []
        sections = text.split_sections(ref)
        if spec.report.with_impression:
            assert set(sections) == {"findings", "impression"}
        else:
            assert sections == {}
        assert len(text.prepare(ref).split()) >= 4  # BLEU-4 needs four tokens for a perfect 1.0


def test_chest_reports_name_what_was_drawn(tmp_path):
    spec = load_spec("mimic-cxr-report")
    synth.synth(spec, tmp_path, cases=12, seed=3)
    seen = set()
    for path in (tmp_path / "private").glob("*/report.txt"):
        labels = chexpert_rules.label_report(path.read_text())
        seen |= {k for k, v in labels.items() if v}
    # a dozen studies cover normal and abnormal reports with the common findings
    assert {"No Finding", "Pleural Effusion"} <= seen and len(seen) >= 4


def test_deterministic_per_seed(tmp_path):
    twin_is_deterministic(load_spec("iu-xray-report"), tmp_path, 3, 11)


def test_perfect_submission_copies_references(tmp_path):
    spec = load_spec("pathology-caption-500")
    synth.synth(spec, tmp_path / "data", cases=2, seed=0)
    synth.perfect_submission(spec, tmp_path / "data", tmp_path / "ws")
    for case in ("path_0000", "path_0001"):
        assert (tmp_path / "ws" / "agent_outputs" / case / "report.txt").read_bytes() == (
            tmp_path / "data" / "private" / case / "report.txt"
        ).read_bytes()
