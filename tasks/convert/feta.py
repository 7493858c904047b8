"""FeTA (BIDS layout) → feta-seg.

Source layout (the FeTA 2021/2022 release): ``sub-001/anat/sub-001_rec-<method>_T2w.nii.gz`` and
``sub-001/anat/sub-001_rec-<method>_dseg.nii.gz``, where ``<method>`` names the super-resolution
reconstruction (``mial``, ``irtk``, ``nmic``). The tissue labels 1..7 (eCSF, GM, WM, LV, CBM, SGM,
BS) are the task's own, so the label map is only checked and stored as integers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._volumes import Progress, copy_scan, load, run, save_labels, voxels


def _pair(subject: Path) -> tuple[Path, Path] | None:
    for t2w in sorted((subject / "anat").glob(f"{subject.name}_rec-*_T2w.nii.gz")):
        dseg = t2w.with_name(t2w.name.replace("_T2w.nii.gz", "_dseg.nii.gz"))
        if dseg.is_file():
            return t2w, dseg
    return None


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Progress = None) -> None:
    subjects = [p for p in sorted(source.glob("sub-*")) if _pair(p) is not None]
    if not subjects:
        raise TaskError(f"{source}: no sub-XXX/anat/sub-XXX_rec-*_T2w.nii.gz with a matching _dseg found")
    allowed = {0, *(lab.id for lab in spec.seg.labels)} if spec.seg else {0}

    def convert(case: str) -> None:
        # Why the ignore[misc] below: the case list holds only cases whose pair was found.
        t2w, dseg = _pair(source / case)  # type: ignore[misc]
        seg_img = load(dseg)
        labels = np.rint(voxels(seg_img, dseg)).astype(np.int64)
        unknown = set(np.unique(labels).tolist()) - allowed
        if unknown:
            raise TaskError(f"{dseg}: labels {sorted(unknown)} are not FeTA tissue labels")
        copy_scan(t2w, out / "public" / case / "t2w.nii.gz")
        save_labels(labels, seg_img, out / "private" / case / "dseg.nii.gz")

    run([p.name for p in subjects], convert, progress)
