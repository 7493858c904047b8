"""Every task folder loads, is consistent with its track's contract, and has both briefs."""

from __future__ import annotations

from typing import get_args

import pytest

from schemas.task_spec import TIERS, TaskError, Track
from tasks.registry import all_specs, brief, load_spec, task_ids

SPECS = all_specs()
SEG = [s for s in SPECS if s.track == "segmentation"]


def test_ids_are_unique_and_match_folders():
    assert len(task_ids()) == len({s.id for s in SPECS}) == len(SPECS)
    assert all(s.track in get_args(Track) for s in SPECS)


def test_the_eight_segmentation_tasks():
    assert sorted(s.id for s in SEG) == [
        "aeropath-seg",
        "feta-seg",
        "kidney-seg",
        "pancreas-oar-seg",
        "pancreas-seg",
        "panther-t1-seg",
        "panther-t2-seg",
        "tsg-multiorgan-seg",
    ]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_briefs_exist_and_differ(spec):
    lite, standard = brief(spec.id, "lite"), brief(spec.id, "standard")
    assert lite.strip() and standard.strip() and lite != standard


@pytest.mark.parametrize("spec", SEG, ids=lambda s: s.id)
def test_segmentation_contract_is_consistent(spec):
    seg = spec.seg
    assert spec.metric.name == "macro_dice" and spec.submission.format == "nifti"
    assert seg.input_file in spec.public.files
    if seg.mode == "binary":
        files = [t.file for t in seg.targets]
        assert sorted(t.kind for t in seg.targets) == ["lesion", "organ"]
        assert spec.private.files == files
        assert spec.submission.files == [f"{{case}}/{f}" for f in files]
        assert spec.submission.label_ids == [1]
    else:
        ids = [lab.id for lab in seg.labels]
        assert len(ids) == len(set(ids)) and 0 not in ids
        assert spec.submission.label_ids == ids
        assert spec.private.files == [seg.label_file]
        assert spec.submission.files == [f"{{case}}/{seg.label_file}"]


@pytest.mark.parametrize(
    ("task_id", "n", "first", "last"),
    [
        ("feta-seg", 7, "eCSF", "BS"),
        ("tsg-multiorgan-seg", 117, "spleen", "costal_cartilages"),
        ("aeropath-seg", 2, "lung", "airway"),
    ],
)
def test_label_tables(task_id, n, first, last):
    seg = load_spec(task_id).seg
    assert seg is not None
    labels = seg.labels
    assert len(labels) == n and labels[0].name == first and labels[-1].name == last
    assert [lab.id for lab in labels] == list(range(1, n + 1))


def test_pancreas_oar_uses_the_21_source_ids():
    seg = load_spec("pancreas-oar-seg").seg
    assert seg is not None
    ids = [lab.id for lab in seg.labels]
    assert ids == [1, 2, 3, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 22, 23, 24, 25, 26, 28]


def test_lite_names_the_method_and_standard_does_not():
    lite, standard = brief("kidney-seg", "lite"), brief("kidney-seg", "standard")
    assert "nnU-Net" in lite and "KagglingFace/nnUNet-KiTS19-3d-lowres-50epochs" in lite
    assert "KagglingFace" not in standard and "3d_lowres" not in standard
    assert "Validate" in lite


def test_unknown_task_and_tier_are_clear_errors():
    with pytest.raises(TaskError, match="unknown task 'nope'"):
        load_spec("nope")
    with pytest.raises(TaskError, match="unknown tier 'pro'"):
        brief("kidney-seg", "pro")
    assert set(TIERS) == {"lite", "standard"}
