"""Converters from the real datasets' layouts (KiTS19, FeTA, TotalSegmentator, AeroPath, PanTS), on
tiny fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest

from schemas.task_spec import TaskError
from scorer.grader import grade
from scorer.grader.options import GradeOptions
from tasks import convert, synth
from tasks.registry import load_spec

AFFINE = np.array([[0.0, 0.0, 3.0, 0.0], [0.0, -0.78, 0.0, 0.0], [-0.78, 0.0, 0.0, 0.0], [0, 0, 0, 1]])


def save(path: Path, data: np.ndarray, dtype=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.asarray(data)
    nib.save(nib.Nifti1Image(data.astype(dtype or data.dtype), AFFINE), str(path))


def volume(seed: int, shape=(6, 5, 4)) -> np.ndarray:
    return np.random.default_rng(seed).integers(-1000, 1000, shape).astype(np.int16)


def load(path: Path) -> np.ndarray:
    return np.asanyarray(nib.nifti1.load(str(path)).dataobj)


def self_grade(task_id: str, out: Path, tmp_path: Path) -> float:
    spec = load_spec(task_id)
    synth.perfect_submission(spec, out, tmp_path / "ws")
    return grade(spec, tmp_path / "ws", out / "private", GradeOptions()).score


def test_kits19(tmp_path):
    src = tmp_path / "kits19" / "data"
    seg0 = np.zeros((6, 5, 4), np.uint8)
    seg0[1:4, 1:4, 1:3] = 1
    seg0[2, 2, 1] = 2
    seg1 = np.zeros((6, 5, 4), np.uint8)
    seg1[0:2, 0:2, 0:2] = 1  # no tumour
    for i, seg in enumerate((seg0, seg1)):
        save(src / f"case_{i:05d}" / "imaging.nii.gz", volume(i))
        save(src / f"case_{i:05d}" / "segmentation.nii.gz", seg)
    save(src / "case_00210" / "imaging.nii.gz", volume(9))  # a test case: no segmentation, skipped
    out = tmp_path / "out"
    seen: list[Any] = []
    convert.prepare(load_spec("kidney-seg"), src, out, progress=seen.append)
    assert seen == ["case_00000", "case_00001"]
    assert (out / "public" / "case_00000" / "ct.nii.gz").read_bytes() == (
        src / "case_00000" / "imaging.nii.gz"
    ).read_bytes()
    organ = load(out / "private" / "case_00000" / "organ.nii.gz")
    lesion = load(out / "private" / "case_00000" / "lesion.nii.gz")
    np.testing.assert_array_equal(organ, (seg0 >= 1).astype(np.uint8))  # kidney region includes the tumour
    np.testing.assert_array_equal(lesion, (seg0 == 2).astype(np.uint8))
    assert not load(out / "private" / "case_00001" / "lesion.nii.gz").any()
    assert np.allclose(nib.nifti1.load(str(out / "private" / "case_00000" / "organ.nii.gz")).affine, AFFINE)
    assert not (out / "public" / "case_00210").exists()
    assert self_grade("kidney-seg", out, tmp_path) == pytest.approx(1.0)


def test_feta_bids(tmp_path):
    src = tmp_path / "feta_2.1"
    dseg = np.random.default_rng(0).integers(0, 8, (6, 5, 4)).astype(np.float32)
    save(src / "sub-001" / "anat" / "sub-001_rec-mial_T2w.nii.gz", volume(1).astype(np.float32))
    save(src / "sub-001" / "anat" / "sub-001_rec-mial_dseg.nii.gz", dseg)
    save(src / "sub-002" / "anat" / "sub-002_rec-irtk_T2w.nii.gz", volume(2).astype(np.float32))
    save(src / "sub-002" / "anat" / "sub-002_rec-irtk_dseg.nii.gz", dseg[::-1].copy())
    (src / "participants.tsv").write_text("participant_id\tPathology\nsub-001\tNeurotypical\n")
    out = tmp_path / "out"
    convert.prepare(load_spec("feta-seg"), src, out)
    assert sorted(p.name for p in (out / "public").iterdir()) == ["sub-001", "sub-002"]
    labels = load(out / "private" / "sub-001" / "dseg.nii.gz")
    assert labels.dtype == np.uint8
    np.testing.assert_array_equal(labels, dseg.astype(np.uint8))
    assert self_grade("feta-seg", out, tmp_path) == pytest.approx(1.0)


def test_feta_rejects_foreign_labels(tmp_path):
    src = tmp_path / "feta"
    save(src / "sub-001" / "anat" / "sub-001_rec-mial_T2w.nii.gz", volume(1))
    save(src / "sub-001" / "anat" / "sub-001_rec-mial_dseg.nii.gz", np.full((6, 5, 4), 9, np.uint8))
    with pytest.raises(TaskError, match=r"labels \[9\] are not FeTA tissue labels"):
        convert.prepare(load_spec("feta-seg"), src, tmp_path / "out")


def test_totalsegmentator(tmp_path):
    src = tmp_path / "Totalsegmentator_dataset_v201"
    shape = (6, 5, 4)
    case = src / "s0011"
    save(case / "ct.nii.gz", volume(3, shape))
    spleen = np.zeros(shape, np.uint8)
    spleen[0:2] = 1
    liver = np.zeros(shape, np.uint8)
    liver[1:4] = 1  # overlaps the spleen on x = 1: liver (id 5) is written later and wins
    save(case / "segmentations" / "spleen.nii.gz", spleen)
    save(case / "segmentations" / "liver.nii.gz", liver)
    save(
        case / "segmentations" / "costal_cartilages.nii.gz",
        np.pad(np.ones((1, 5, 4), np.uint8), ((5, 0), (0, 0), (0, 0))),
    )
    save(case / "segmentations" / "aorta.nii.gz", np.zeros(shape, np.uint8))  # absent structure: empty mask
    (src / "meta.csv").write_text("image_id;age;gender\ns0011;60;m\n")
    out = tmp_path / "out"
    convert.prepare(load_spec("tsg-multiorgan-seg"), src, out)
    labels = load(out / "private" / "s0011" / "dseg.nii.gz")
    assert labels[0, 0, 0] == 1 and labels[1, 0, 0] == 5 and labels[3, 0, 0] == 5 and labels[5, 0, 0] == 117
    assert set(np.unique(labels).tolist()) == {0, 1, 5, 117}
    assert self_grade("tsg-multiorgan-seg", out, tmp_path) == pytest.approx(1.0)


def test_aeropath(tmp_path):
    src = tmp_path / "AeroPath"
    shape = (6, 5, 4)
    lungs = np.zeros(shape, np.uint8)
    lungs[1:5] = 1
    airways = np.zeros(shape, np.uint8)
    airways[2:4, 2, :] = 1
    for n in (1, 2, 10):
        save(src / str(n) / f"{n}_CT_HR.nii.gz", volume(n, shape))
        save(src / str(n) / f"{n}_CT_HR_label_lungs.nii.gz", lungs)
        save(src / str(n) / f"{n}_CT_HR_label_airways.nii.gz", airways)
    (src / "README.md").write_text("AeroPath")
    out = tmp_path / "out"
    seen: list[Any] = []
    convert.prepare(load_spec("aeropath-seg"), src, out, progress=seen.append)
    assert seen == ["1", "2", "10"]
    assert sorted(p.name for p in (out / "private").iterdir()) == [
        "aeropath_001",
        "aeropath_002",
        "aeropath_010",
    ]
    labels = load(out / "private" / "aeropath_010" / "dseg.nii.gz")
    assert labels[2, 2, 0] == 2 and labels[1, 0, 0] == 1 and labels[0, 0, 0] == 0
    assert self_grade("aeropath-seg", out, tmp_path) == pytest.approx(1.0)


def test_pants(tmp_path):
    src = tmp_path / "PanTS" / "data"
    shape = (6, 5, 4)
    head = np.zeros(shape, np.uint8)
    head[0:2, 1:3, 1:3] = 1
    body = np.zeros(shape, np.uint8)
    body[2:4, 1:3, 1:3] = 1
    lesion = np.zeros(shape, np.uint8)
    lesion[3:5, 2, 2] = 1  # pokes one voxel out of the body mask: the organ takes it in
    for split, case in (("Tr", "PanTS_00000001"), ("Te", "PanTS_00009001")):
        save(src / f"Image{split}" / case / "ct.nii.gz", volume(4, shape))
        seg = src / f"Label{split}" / case / "segmentations"
        save(seg / "pancreas_head.nii.gz", head)
        save(seg / "pancreas_body.nii.gz", body)
        save(seg / "aorta.nii.gz", np.zeros(shape, np.uint8))
    save(src / "LabelTr" / "PanTS_00000001" / "segmentations" / "pancreatic_lesion.nii.gz", lesion)
    save(src / "ImageTr" / "PanTS_00000002" / "ct.nii.gz", volume(5, shape))  # no labels: skipped
    out = tmp_path / "out"
    convert.prepare(load_spec("pancreas-seg"), src, out)
    assert sorted(p.name for p in (out / "private").iterdir()) == ["PanTS_00000001", "PanTS_00009001"]
    organ = load(out / "private" / "PanTS_00000001" / "organ.nii.gz")
    np.testing.assert_array_equal(organ, (head | body | lesion).astype(np.uint8))
    np.testing.assert_array_equal(load(out / "private" / "PanTS_00000001" / "lesion.nii.gz"), lesion)
    assert not load(out / "private" / "PanTS_00009001" / "lesion.nii.gz").any()
    assert self_grade("pancreas-seg", out, tmp_path) == pytest.approx(1.0)


def test_pants_case_without_pancreas_is_an_error(tmp_path):
    save(tmp_path / "ImageTr" / "PanTS_00000001" / "ct.nii.gz", volume(1))
    save(
        tmp_path / "LabelTr" / "PanTS_00000001" / "segmentations" / "aorta.nii.gz",
        np.zeros((6, 5, 4), np.uint8),
    )
    with pytest.raises(TaskError, match="no pancreas mask"):
        convert.prepare(load_spec("pancreas-seg"), tmp_path, tmp_path / "out")


@pytest.mark.parametrize(
    ("task_id", "needle"),
    [
        ("kidney-seg", "no case_XXXXX/segmentation.nii.gz found"),
        ("feta-seg", "no sub-XXX/anat"),
        ("tsg-multiorgan-seg", "no sXXXX/segmentations/"),
        ("aeropath-seg", "no <n>/<n>_CT_HR.nii.gz found"),
        ("pancreas-seg", "no ImageTr/PanTS_"),
    ],
)
def test_wrong_source_layout_is_one_clear_error(tmp_path, task_id, needle):
    (tmp_path / "src" / "something").mkdir(parents=True)
    with pytest.raises(TaskError, match=needle):
        convert.prepare(load_spec(task_id), tmp_path / "src", tmp_path / "out")


def test_corrupt_source_file_names_the_file(tmp_path):
    src = tmp_path / "data"
    save(src / "case_00000" / "imaging.nii.gz", volume(0))
    (src / "case_00000" / "segmentation.nii.gz").write_bytes(b"\x1f\x8b\x08\x00broken")
    with pytest.raises(TaskError, match=r"source file unreadable: .*segmentation.nii.gz"):
        convert.prepare(load_spec("kidney-seg"), src, tmp_path / "out")


def test_missing_source_dir_and_task_without_converter(tmp_path):
    with pytest.raises(TaskError, match="not a directory"):
        convert.prepare(load_spec("kidney-seg"), tmp_path / "nope", tmp_path / "out")
    with pytest.raises(TaskError, match="no converter"):
        convert.prepare(load_spec("panther-t1-seg"), tmp_path, tmp_path / "out")
