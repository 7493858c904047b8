"""Shared helpers of the NIfTI converters: find cases, copy scans, write label maps on a scan's grid."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import nibabel as nib
import numpy as np

from schemas.task_spec import TaskError

Progress = Callable[[str], None] | None


def load(path: Path) -> nib.Nifti1Image:
    """Open a source NIfTI file; a missing or corrupt one is a ``TaskError`` naming it."""
    if not path.is_file():
        raise TaskError(f"source file missing: {path}")
    try:
        img = nib.load(str(path))
        if not isinstance(img, nib.Nifti1Image):  # NIfTI-2 images are a subclass
            raise TaskError(f"source file is not a NIfTI image: {path} ({type(img).__name__})")
        img.shape  # noqa: B018 - forces the header to be parsed now, not later mid-conversion
        return img
    except TaskError:
        raise
    except Exception as e:  # nibabel raises many types for corrupt files; all mean "unreadable"
        raise TaskError(f"source file unreadable: {path}: {e}") from e


def voxels(img: nib.Nifti1Image, path: Path) -> np.ndarray:
    try:
        return np.asanyarray(img.dataobj)
    except Exception as e:  # as in load(): every failure here is a corrupt source file
        raise TaskError(f"source file unreadable: {path}: {e}") from e


def copy_scan(src: Path, dest: Path) -> None:
    """Copy a scan unchanged when it already is ``.nii.gz``; otherwise re-save it as ``.nii.gz``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.name.endswith(".nii.gz"):
        load(src)  # refuse a corrupt source before copying it into a data set
        shutil.copyfile(src, dest)
    else:
        nib.save(load(src), str(dest))


def save_labels(labels: np.ndarray, grid: nib.Nifti1Image, dest: Path) -> None:
    """Write an integer label volume on the grid (affine, qform/sform) of ``grid``."""
    if labels.shape != grid.shape[:3]:
        raise TaskError(f"{dest.name}: label shape {labels.shape} differs from the scan's {grid.shape}")
    dtype = np.uint8 if labels.max(initial=0) < 256 else np.uint16
    img = nib.Nifti1Image(labels.astype(dtype), grid.affine)
    # Keep the scan's orientation codes so viewers overlay the labels on the scan exactly.
    qform, qcode = grid.get_qform(coded=True)
    sform, scode = grid.get_sform(coded=True)
    if qform is not None:
        img.set_qform(qform, code=int(qcode))
    if sform is not None:
        img.set_sform(sform, code=int(scode))
    img.header.set_xyzt_units(*grid.header.get_xyzt_units())
    dest.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, str(dest))


def mask_on(path: Path, scan: nib.Nifti1Image) -> np.ndarray:
    """The binary mask in ``path``, which must lie on ``scan``'s grid."""
    img = load(path)
    if img.shape[:3] != scan.shape[:3]:
        raise TaskError(f"{path}: shape {img.shape} differs from the scan's {scan.shape}")
    return voxels(img, path) > 0.5


def run(cases: Iterable[str], convert: Callable[[str], None], progress: Progress) -> None:
    """Convert every case, reporting each to ``progress``."""
    for case in cases:
        convert(case)
        if progress is not None:
            progress(case)
