"""A task's case files as the converters and the synthetic generators lay them out."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from schemas.task_spec import TaskError, TaskSpec


def write_json(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_report_case(
    out: Path, spec: TaskSpec, case: str, images: list[str], reference: str, mode: str, source: dict[str, Any]
) -> None:
    """A report case's manifests and reference report beside its images; ``source`` says what it was
    made from, ``mode`` what the reference holds (``full_report`` or ``findings_only``)."""
    assert spec.report is not None
    public = {"case_id": case, "task_id": spec.id, "image_count": len(images), "image_files": images}
    write_json(out / "public" / case / spec.report.manifest_file, public)
    (out / "private" / case).mkdir(parents=True, exist_ok=True)
    (out / "private" / case / spec.report.output_file).write_text(reference + "\n", encoding="utf-8")
    private = {"case_id": case, "task_id": spec.id, **source, "image_count": len(images)}
    private |= {"reference_text_mode": mode, "report_char_count": len(reference)}
    write_json(out / "private" / case / "manifest.json", private)


def grey_jpeg(image: Path) -> bytes:
    """An image re-encoded as the benchmark hands it to agents: greyscale baseline JPEG, quality 95."""
    from PIL import Image

    try:
        with Image.open(image) as im:
            buf = io.BytesIO()
            im.convert("L").save(buf, format="JPEG", quality=95)
    except OSError as e:
        raise TaskError(f"{image}: not a readable image: {e}") from e
    return buf.getvalue()


def write_enhancement_case(out: Path, spec: TaskSpec, case: str, inp: np.ndarray, ref: np.ndarray) -> float:
    """An enhancement case: its input (public) and reference (private) arrays; returns the
    reference's data range (max - min), which the case's SSIM is computed under."""
    assert spec.enh is not None
    pub = out / "public" / spec.public.case_dir.format(case=case)
    priv = out / "private" / spec.private.case_dir.format(case=case)
    pub.mkdir(parents=True, exist_ok=True)
    priv.mkdir(parents=True, exist_ok=True)
    np.save(pub / spec.enh.input_file, inp)
    np.save(priv / spec.enh.reference_file, ref)
    return float(ref.max()) - float(ref.min())
