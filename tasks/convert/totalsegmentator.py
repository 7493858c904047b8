"""TotalSegmentator v2 → tsg-multiorgan-seg.

Source layout (the Zenodo ``Totalsegmentator_dataset_v201`` folder): ``s0000/ct.nii.gz`` and one
binary mask per structure in ``s0000/segmentations/<name>.nii.gz`` (plus ``meta.csv``, unused).
The masks are merged into one label map with the task's ids, matched by structure name; where masks
overlap the structure with the higher id wins (it is written later). A missing mask file means the
structure is absent from that scan.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._volumes import Progress, copy_scan, load, mask_on, run, save_labels


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Progress = None) -> None:
    seg = spec.seg
    assert seg is not None
    subjects = sorted(p.name for p in source.glob("s[0-9]*") if (p / "segmentations").is_dir())
    if not subjects:
        raise TaskError(
            f"{source}: no sXXXX/segmentations/ folders found (is this Totalsegmentator_dataset_v201?)"
        )

    def convert(case: str) -> None:
        src = source / case
        scan = load(src / "ct.nii.gz")
        labels = np.zeros(scan.shape[:3], np.uint8)
        for lab in sorted(seg.labels, key=lambda lab: lab.id):
            path = src / "segmentations" / f"{lab.name}.nii.gz"
            if path.is_file():
                labels[mask_on(path, scan)] = lab.id
        copy_scan(src / "ct.nii.gz", out / "public" / case / "ct.nii.gz")
        save_labels(labels, scan, out / "private" / case / "dseg.nii.gz")

    run(subjects, convert, progress)
