"""PanTS → pancreas-seg.

Source layout (the PanTS repository's ``data/`` folder after its download scripts):
``ImageTr/PanTS_00000001/ct.nii.gz`` with ``LabelTr/PanTS_00000001/segmentations/<structure>.nii.gz``
(one binary mask per structure, AbdomenAtlas naming), and the same under ``ImageTe`` / ``LabelTe``.

The organ mask is the pancreas, taken from ``pancreas.nii.gz`` and any of its sub-region masks
(``pancreas_head``, ``pancreas_body``, ``pancreas_tail``), joined with the lesion (the organ includes
its tumour, as in the other binary tasks); the lesion mask is ``pancreatic_lesion.nii.gz``. A case
without a lesion file has an empty lesion mask; a case with no pancreas mask at all is an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schemas.task_spec import TaskError, TaskSpec
from tasks.convert._volumes import Progress, copy_scan, load, mask_on, run, save_labels

ORGAN_FILES = ("pancreas", "pancreas_head", "pancreas_body", "pancreas_tail")
LESION_FILE = "pancreatic_lesion"


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Progress = None) -> None:
    cases: dict[str, tuple[Path, Path]] = {}
    for images, labels in (("ImageTr", "LabelTr"), ("ImageTe", "LabelTe")):
        for scan in sorted((source / images).glob("PanTS_*/ct.nii.gz")):
            seg_dir = source / labels / scan.parent.name / "segmentations"
            if seg_dir.is_dir():
                cases[scan.parent.name] = (scan, seg_dir)
    if not cases:
        raise TaskError(
            f"{source}: no ImageTr/PanTS_*/ct.nii.gz with LabelTr/PanTS_*/segmentations/ found (is "
            "this PanTS's data/ folder?)"
        )

    def convert(case: str) -> None:
        scan_path, seg_dir = cases[case]
        scan = load(scan_path)

        def mask(name: str) -> np.ndarray | None:
            path = seg_dir / f"{name}.nii.gz"
            return mask_on(path, scan) if path.is_file() else None

        parts = [m for m in (mask(n) for n in ORGAN_FILES) if m is not None]
        if not parts:
            raise TaskError(f"{seg_dir}: no pancreas mask ({', '.join(n + '.nii.gz' for n in ORGAN_FILES)})")
        lesion = mask(LESION_FILE)
        if lesion is None:
            lesion = np.zeros(scan.shape[:3], bool)
        organ = np.logical_or.reduce(parts) | lesion
        copy_scan(scan_path, out / "public" / case / "ct.nii.gz")
        save_labels(organ, scan, out / "private" / case / "organ.nii.gz")
        save_labels(lesion, scan, out / "private" / case / "lesion.nii.gz")

    run(sorted(cases), convert, progress)
