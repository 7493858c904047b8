"""AAPM/Mayo Low Dose CT Grand Challenge data into the LDCT denoising task's layout.

Source layout (the challenge release and TCIA's "LDCT-and-Projection-data" image folders)::

    <source>/<patient>/full_3mm/*.IMA       full-dose reconstructions, one DICOM file per slice
    <source>/<patient>/quarter_3mm/*.IMA    the quarter-dose reconstructions of the same slices
    (``full_1mm``/``quarter_1mm`` likewise; ``.dcm`` files are accepted too)

Per patient the 3 mm pair is used when present, else the 1 mm pair. Slices are paired by DICOM
InstanceNumber (falling back to file-name order when it is absent); the two folders must hold the same
number of slices. SimpleITK applies the rescale slope/intercept, so values are HU. Each pair becomes
one case ``<patient>_<instance:04d>``: ``public/<case>/input.npy`` (quarter dose) and
``private/<case>/reference.npy`` (full dose), float32, plus ``private/ground_truth.csv`` with each
reference's max - min as the SSIM data range (the benchmark's rule).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import SimpleITK as sitk

from schemas.task_spec import TaskError, TaskSpec
from tasks.synth.enhancement import write_case, write_ranges

THICKNESSES = ("3mm", "1mm")
DICOM_SUFFIXES = {".ima", ".dcm"}


def _instance(path: Path) -> int | None:
    reader = sitk.ImageFileReader()
    reader.SetImageIO("GDCMImageIO")
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
        return int(reader.GetMetaData("0020|0013").strip()) if reader.HasMetaDataKey("0020|0013") else None
    except (RuntimeError, ValueError):
        return None


def _slices(folder: Path) -> list[tuple[int, Path]]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in DICOM_SUFFIXES)
    numbered = [(_instance(p), p) for p in files]
    if all(n is not None for n, _ in numbered) and len({n for n, _ in numbered}) == len(numbered):
        # Why the ignore[arg-type] below: every number was checked not None just above.
        return sorted(numbered)  # type: ignore[arg-type]
    return [(i + 1, p) for i, p in enumerate(files)]


def read_hu(path: Path) -> np.ndarray:
    try:
        img = sitk.ReadImage(str(path), imageIO="GDCMImageIO")
    except RuntimeError as e:
        raise TaskError(f"{path}: not a readable DICOM slice ({str(e).splitlines()[0]})") from e
    arr = sitk.GetArrayFromImage(img).astype(np.float32)
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2:
        raise TaskError(f"{path}: expected one 2-D slice, got shape {arr.shape}")
    return arr


def patient_pairs(patient: Path) -> tuple[Path, Path] | None:
    for t in THICKNESSES:
        full, quarter = patient / f"full_{t}", patient / f"quarter_{t}"
        if full.is_dir() and quarter.is_dir():
            return full, quarter
    return None


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    if spec.enh is None or spec.enh.kind != "denoise":
        raise TaskError(f"task {spec.id}: the aapm_ldct converter is for the LDCT denoising task")
    patients = [
        (p, pair) for p in sorted(Path(source).iterdir()) if p.is_dir() and (pair := patient_pairs(p))
    ]
    if not patients:
        raise TaskError(f"--source {source}: no <patient>/full_3mm + quarter_3mm (or _1mm) folders")
    ranges: dict[str, float] = {}
    for patient, (full, quarter) in patients:
        fs, qs = _slices(full), _slices(quarter)
        if len(fs) != len(qs) or not fs:
            raise TaskError(f"{patient}: {full.name} has {len(fs)} slices but {quarter.name} has {len(qs)}")
        for (n, fpath), (_, qpath) in zip(fs, qs, strict=False):
            ref, inp = read_hu(fpath), read_hu(qpath)
            if ref.shape != inp.shape:
                raise TaskError(f"{fpath} and {qpath}: shapes {ref.shape} and {inp.shape} differ")
            case = f"{patient.name}_{n:04d}"
            ranges[case] = write_case(spec, out, case, inp, ref)
            if progress:
                progress(case)
    write_ranges(out / "private" / spec.enh.ranges_file, ranges)
