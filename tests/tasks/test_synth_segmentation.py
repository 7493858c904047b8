"""Synthetic segmentation twins: the task's layout, plausible NIfTI content, deterministic per seed."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from schemas.task_spec import TaskError
from tasks import synth
from tasks.registry import all_specs, load_spec
from tests.tasks.helpers import digest_tree, twin_is_deterministic

SEG = [s for s in all_specs() if s.track == "segmentation"]


@pytest.mark.parametrize("spec", SEG, ids=lambda s: s.id)
def test_layout_and_content(spec, tmp_path):
    synth.synth(spec, tmp_path, cases=3, seed=0)
    cases = [spec.case_id(i) for i in range(3)]
    assert sorted(p.name for p in (tmp_path / "public").iterdir()) == sorted(cases)
    for case in cases:
        assert sorted(p.name for p in (tmp_path / "public" / case).iterdir()) == sorted(spec.public.files)
        assert sorted(p.name for p in (tmp_path / "private" / case).iterdir()) == sorted(spec.private.files)
        img = nib.nifti1.load(str(tmp_path / "public" / case / spec.seg.input_file))
        data = np.asanyarray(img.dataobj)
        assert list(img.shape) == spec.seg.synth_shape
        assert np.allclose(img.header.get_zooms(), spec.seg.synth_spacing, atol=1e-5)
        assert img.header.get_xyzt_units()[0] == "mm" and int(img.header["sform_code"]) == 1
        assert np.isfinite(data).all()
        if spec.modality == "CT":
            assert data.dtype == np.int16 and data.min() >= -1024 and data.max() <= 3071
            assert data.min() < -900  # air around the body
        else:
            assert data.dtype == np.float32 and data.min() >= 0
        for name in spec.private.files:
            ref = nib.nifti1.load(str(tmp_path / "private" / case / name))
            assert ref.shape == img.shape and np.allclose(ref.affine, img.affine)
            labels = np.asanyarray(ref.dataobj)
            assert labels.dtype == np.uint8
            allowed = {0, 1} if spec.seg.mode == "binary" else {0, *(lab.id for lab in spec.seg.labels)}
            assert set(np.unique(labels).tolist()) <= allowed


@pytest.mark.parametrize("spec", [s for s in SEG if s.seg and s.seg.mode == "binary"], ids=lambda s: s.id)
def test_binary_twins_have_lesion_free_cases_and_nested_lesions(spec, tmp_path):
    synth.synth(spec, tmp_path, cases=3, seed=5)
    positive = []
    for i in range(3):
        case = tmp_path / "private" / spec.case_id(i)
        organ = np.asanyarray(nib.nifti1.load(str(case / "organ.nii.gz")).dataobj) > 0
        lesion = np.asanyarray(nib.nifti1.load(str(case / "lesion.nii.gz")).dataobj) > 0
        assert organ.sum() > 100
        assert not (lesion & ~organ).any()  # the lesion lies inside the organ
        positive.append(bool(lesion.any()))
    assert positive == [True, True, False]  # every third case is lesion-free


@pytest.mark.parametrize("spec", [s for s in SEG if s.seg and s.seg.mode == "multiclass"], ids=lambda s: s.id)
def test_multiclass_twins_cover_most_labels(spec, tmp_path):
    synth.synth(spec, tmp_path, cases=1, seed=0)
    labels = np.asanyarray(
        nib.nifti1.load(str(tmp_path / "private" / spec.case_id(0) / spec.seg.label_file)).dataobj
    )
    present = set(np.unique(labels).tolist()) - {0}
    assert len(present) >= 0.85 * len(spec.seg.labels)


def test_deterministic_per_seed_and_case(tmp_path):
    spec = load_spec("kidney-seg")
    twin_is_deterministic(spec, tmp_path, 2, 3)
    synth.synth(spec, tmp_path / "d", cases=3, seed=3)
    a, d = digest_tree(tmp_path / "a"), digest_tree(tmp_path / "d")
    assert {k: v for k, v in d.items() if k in a} == a  # case i does not depend on the case count


def test_perfect_submission_mirrors_the_references(tmp_path):
    spec = load_spec("feta-seg")
    synth.synth(spec, tmp_path / "data", cases=2, seed=0)
    synth.perfect_submission(spec, tmp_path / "data", tmp_path / "ws")
    out = tmp_path / "ws" / "agents_outputs"
    assert digest_tree(out) == digest_tree(tmp_path / "data" / "private")


def test_case_count_must_be_positive(tmp_path):
    with pytest.raises(TaskError, match="at least 1"):
        synth.synth(load_spec("kidney-seg"), tmp_path, cases=0)
