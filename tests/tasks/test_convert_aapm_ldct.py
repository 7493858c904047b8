"""The AAPM low-dose CT converter on a tiny fixture of DICOM slices in the challenge's layout."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from schemas.task_spec import TaskError
from scorer.grader import grade
from tasks.convert import prepare
from tasks.registry import load_spec
from tasks.synth import perfect_submission


def write_slice(path: Path, hu: np.ndarray, instance: int) -> None:
    img = sitk.GetImageFromArray(hu.astype(np.int16)[None])
    img.SetSpacing((0.7, 0.7, 3.0))
    img.SetMetaData("0008|0060", "CT")
    img.SetMetaData("0020|0013", str(instance))
    writer = sitk.ImageFileWriter()
    writer.SetImageIO("GDCMImageIO")
    writer.KeepOriginalImageUIDOn()
    writer.SetFileName(str(path))
    writer.Execute(img)


def make_aapm(root: Path, patients: dict[str, int], thickness="3mm", size=24) -> Path:
    rng = np.random.default_rng(0)
    for pid, n in patients.items():
        full, quarter = root / pid / f"full_{thickness}", root / pid / f"quarter_{thickness}"
        full.mkdir(parents=True)
        quarter.mkdir(parents=True)
        for k in range(n):
            inst = n - k  # files in name order run opposite to the instance numbers
            clean = np.full((size, size), -1000.0)
            clean[4:-4, 4:-4] = 40.0 + 10 * inst
            noisy = clean + rng.normal(0, 30, clean.shape)
            write_slice(full / f"{pid}_FD_3_1.CT.0001.{k + 1:04d}.2015.12.22.IMA", clean, inst)
            write_slice(quarter / f"{pid}_QD_3_1.CT.0003.{k + 1:04d}.2015.12.22.IMA", noisy, inst)
    return root


def test_pairs_slices_by_instance_number_in_hu(tmp_path):
    src = make_aapm(tmp_path / "src", {"L067": 3, "L096": 2})
    spec = load_spec("ldct-denoising")
    seen: list[str] = []
    prepare(spec, src, tmp_path / "out", progress=seen.append)
    cases = sorted(p.name for p in (tmp_path / "out" / "private").iterdir() if p.is_dir())
    assert cases == seen == ["L067_0001", "L067_0002", "L067_0003", "L096_0001", "L096_0002"]
    ref = np.load(tmp_path / "out/private/L067_0002/reference.npy")
    inp = np.load(tmp_path / "out/public/L067_0002/input.npy")
    assert ref.dtype == np.float32 and inp.dtype == np.float32 and ref.shape == inp.shape == (24, 24)
    assert ref.min() == -1000.0 and ref[12, 12] == 60.0  # instance 2 -> 40 + 20 HU
    assert 10 < float(np.std(inp - ref)) < 60
    rows = list(csv.DictReader(open(tmp_path / "out/private/ground_truth.csv")))
    assert {r["patient_id"]: float(r["data_range"]) for r in rows}["L067_0002"] == 1060.0
    perfect_submission(spec, tmp_path / "out", tmp_path / "ws")
    assert grade(spec, tmp_path / "ws", tmp_path / "out" / "private").score == 1.0


def test_falls_back_to_1mm(tmp_path):
    src = make_aapm(tmp_path / "src", {"L143": 1}, thickness="1mm")
    prepare(load_spec("ldct-denoising"), src, tmp_path / "out")
    assert (tmp_path / "out/public/L143_0001/input.npy").is_file()


def test_unequal_folders_and_bad_sources_are_one_clear_error(tmp_path):
    src = make_aapm(tmp_path / "src", {"L067": 2})
    next((src / "L067" / "quarter_3mm").iterdir()).unlink()
    with pytest.raises(TaskError, match="has 2 slices but quarter_3mm has 1"):
        prepare(load_spec("ldct-denoising"), src, tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="no <patient>/full_3mm"):
        prepare(load_spec("ldct-denoising"), tmp_path / "empty", tmp_path / "out2")


def test_corrupt_dicom_is_named(tmp_path):
    src = make_aapm(tmp_path / "src", {"L067": 1})
    bad = next((src / "L067" / "full_3mm").iterdir())
    bad.write_bytes(b"not dicom")
    with pytest.raises(TaskError, match="not a readable DICOM"):
        prepare(load_spec("ldct-denoising"), src, tmp_path / "out")
