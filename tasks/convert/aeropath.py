"""AeroPath → aeropath-seg.

Source layout (the Zenodo ``AeroPath/`` folder): ``<n>/<n>_CT_HR.nii.gz`` with
``<n>_CT_HR_label_lungs.nii.gz`` and ``<n>_CT_HR_label_airways.nii.gz`` (binary masks), n = 1..27.
They are merged into one label map: 1 lung, 2 airway (the airway wins where both are set, since
the airway lumen lies inside the lung mask).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._volumes import Progress, copy_scan, load, mask_on, run, save_labels


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Progress = None) -> None:
    numbers = sorted(
        (
            p.name
            for p in source.iterdir()
            if p.is_dir() and p.name.isdigit() and (p / f"{p.name}_CT_HR.nii.gz").is_file()
        ),
        key=int,
    )
    if not numbers:
        raise TaskError(f"{source}: no <n>/<n>_CT_HR.nii.gz found (is this the AeroPath/ folder?)")

    def convert(n: str) -> None:
        src = source / n
        case = spec.case_id(int(n) - 1)
        scan = load(src / f"{n}_CT_HR.nii.gz")
        labels = np.zeros(scan.shape[:3], np.uint8)
        for suffix, value in (("lungs", 1), ("airways", 2)):
            labels[mask_on(src / f"{n}_CT_HR_label_{suffix}.nii.gz", scan)] = value
        copy_scan(src / f"{n}_CT_HR.nii.gz", out / "public" / case / "ct.nii.gz")
        save_labels(labels, scan, out / "private" / case / "dseg.nii.gz")

    run(numbers, convert, progress)
