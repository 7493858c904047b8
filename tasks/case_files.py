"""The files every synthesiser and converter writes into a task's ``public/`` and ``private/`` folders:
JSON and CSV files, and a whole report-generation case."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from schemas.task_spec import TaskError, TaskSpec


def write_json(path: Path, obj: dict[str, Any], *, ensure_ascii: bool = True) -> None:
    """``obj`` as indented JSON with a final newline, its folder made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=ensure_ascii) + "\n", encoding="utf-8")


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as a CSV table, the first row's keys as its header."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def grey_jpeg(path: Path) -> bytes:
    """An image file re-encoded as a greyscale baseline JPEG (quality 95), as the benchmark hands
    report images to the agent."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            buf = io.BytesIO()
            im.convert("L").save(buf, format="JPEG", quality=95)
    except OSError as e:
        raise TaskError(f"{path}: not a readable image: {e}") from e
    return buf.getvalue()


def write_report_case(
    out: Path,
    spec: TaskSpec,
    case: str,
    images: list[bytes],
    reference: str,
    mode: str,
    source: dict[str, Any] | None = None,
) -> None:
    """One report case: its JPEG views (``01.jpg``, ...) and manifest under ``public/``, its reference
    report and a manifest (``source`` says where it came from) under ``private/``."""
    assert spec.report is not None
    names = [f"{k + 1:02d}.jpg" for k in range(len(images))]
    image_dir = out / "public" / case / spec.report.images_dir
    image_dir.mkdir(parents=True, exist_ok=True)
    for name, data in zip(names, images, strict=True):
        (image_dir / name).write_bytes(data)
    public = {"case_id": case, "task_id": spec.id, "image_count": len(names), "image_files": names}
    write_json(out / "public" / case / spec.report.manifest_file, public)
    (out / "private" / case).mkdir(parents=True, exist_ok=True)
    (out / "private" / case / spec.report.output_file).write_text(reference + "\n", encoding="utf-8")
    facts = {"image_count": len(names), "reference_text_mode": mode, "report_char_count": len(reference)}
    private = {"case_id": case, "task_id": spec.id, **(source or {}), **facts}
    write_json(out / "private" / case / "manifest.json", private)
