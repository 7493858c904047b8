"""KiTS19 → kidney-seg.

Source layout (the ``data/`` folder of the KiTS19 repository after ``get_imaging.py``):
``case_00000/imaging.nii.gz`` and ``case_00000/segmentation.nii.gz`` with labels 0 background,
1 kidney, 2 tumour. Test cases (no ``segmentation.nii.gz``) are skipped: they have no reference.

The organ mask is the whole kidney region (labels 1 and 2), as in the KiTS19 "kidney" Dice; the
lesion mask is the tumour (label 2). The scan is copied unchanged, so its (unusual, ijk = z,y,x)
affine is kept and the masks share its grid.
"""

from __future__ import annotations

from pathlib import Path

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._volumes import Progress, copy_scan, load, run, save_labels, voxels


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Progress = None) -> None:
    cases = sorted(p.name for p in source.glob("case_*") if (p / "segmentation.nii.gz").is_file())
    if not cases:
        raise TaskError(f"{source}: no case_XXXXX/segmentation.nii.gz found (is this KiTS19's data/ folder?)")

    def convert(case: str) -> None:
        src = source / case
        seg_path = src / "segmentation.nii.gz"
        seg_img = load(seg_path)
        labels = voxels(seg_img, seg_path)
        scan = load(src / "imaging.nii.gz")
        if scan.shape != seg_img.shape:
            raise TaskError(f"{src}: imaging {scan.shape} and segmentation {seg_img.shape} differ in shape")
        copy_scan(src / "imaging.nii.gz", out / "public" / case / "ct.nii.gz")
        save_labels((labels >= 1) & (labels <= 2), seg_img, out / "private" / case / "organ.nii.gz")
        save_labels(labels == 2, seg_img, out / "private" / case / "lesion.nii.gz")

    run(cases, convert, progress)
