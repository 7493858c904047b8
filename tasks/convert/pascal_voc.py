"""Pascal VOC detection datasets (BCCD's distribution layout) into a detection task's layout.

Source layout (the BCCD repository, or any VOC-style set)::

    <source>/[BCCD/]Annotations/<stem>.xml      one <annotation> per image: <size>, <object>s
    <source>/[BCCD/]JPEGImages/<stem>.jpg       the images (.jpg, .jpeg or .png)
    <source>/[BCCD/]ImageSets/Main/test.txt     optional split: the stems to convert

With ``ImageSets/Main/test.txt`` only the test split is converted (the benchmark scores held-out
images); without it, every annotated image. VOC boxes are 1-based inclusive pixel indices; the task
uses continuous 0-based coordinates, so ``x1 = xmin - 1`` and ``x2 = xmax``, clipped to the image.
Class names are matched case-insensitively to the task's classes; an unknown class is an error that
names the file. Each image becomes ``public/<stem>/image.png`` and ``private/<stem>/boxes.json``.
"""

from __future__ import annotations

import json
import math
import reprlib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from schemas.task_spec import TaskError, TaskSpec
from tasks.synth import case_dirs

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".JPG", ".JPEG", ".PNG")


def _int(node: ET.Element | None, tag: str, where: str) -> float:
    el = node.find(tag) if node is not None else None
    text = el.text if el is not None else None
    try:
        value = float(text or "")
    except ValueError:
        raise TaskError(f"{where}: missing or non-numeric <{tag}>") from None
    if not math.isfinite(value):  # (a number of 400 digits reads as an infinity)
        raise TaskError(f"{where}: <{tag}> is not a finite number ({reprlib.repr(text)})")
    return value


def _pixels(size: ET.Element | None, tag: str, where: str) -> int:
    """An image side of ``<size>``: a whole, positive number of pixels (``640``, ``640.0``); a
    fraction is refused, not cut to an integer."""
    value = _int(size, tag, where)
    if not value.is_integer() or value <= 0:
        text = size.findtext(tag) if size is not None else None
        raise TaskError(f"{where}: <{tag}> is not a whole, positive number of pixels ({reprlib.repr(text)})")
    return int(value)


def read_annotation(path: Path, classes: dict[str, str]) -> tuple[int, int, list[dict]]:
    """(width, height, boxes) of one VOC XML file, boxes in the task's coordinates and class names."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise TaskError(f"{path}: not readable VOC XML ({e})") from e
    size = root.find("size")
    w, h = _pixels(size, "width", str(path)), _pixels(size, "height", str(path))
    boxes = []
    for obj in root.iter("object"):
        name = (obj.findtext("name") or "").strip()
        if name.lower() not in classes:
            raise TaskError(
                f"{path}: class {name!r} is not one of the task's classes {sorted(classes.values())}"
            )
        bb = obj.find("bndbox")
        x1 = max(0.0, _int(bb, "xmin", str(path)) - 1)
        y1 = max(0.0, _int(bb, "ymin", str(path)) - 1)
        x2 = min(float(w), _int(bb, "xmax", str(path)))
        y2 = min(float(h), _int(bb, "ymax", str(path)))
        if x2 > x1 and y2 > y1:  # BCCD has a few degenerate boxes; they cannot be matched anyway
            boxes.append({"class": classes[name.lower()], "x1": x1, "y1": y1, "x2": x2, "y2": y2})
    return w, h, boxes


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    if spec.det is None:
        raise TaskError(f"task {spec.id}: the pascal_voc converter is for detection tasks")
    source = Path(source)
    root = next((c for c in (source, source / "BCCD") if (c / "Annotations").is_dir()), None)
    if root is None:
        raise TaskError(f"--source {source}: no Annotations/ folder (expected a Pascal VOC layout)")
    classes = {c.lower(): c for c in spec.submission.classes}
    split = root / "ImageSets" / "Main" / "test.txt"
    if split.is_file():
        stems = split.read_text().split()
    else:
        stems = sorted(p.stem for p in (root / "Annotations").glob("*.xml"))
    if not stems:
        raise TaskError(f"--source {source}: no annotations to convert")
    for stem in stems:
        xml = root / "Annotations" / f"{stem}.xml"
        if not xml.is_file():
            raise TaskError(f"{xml}: listed in {split.name} but missing")
        candidates = (root / "JPEGImages" / f"{stem}{s}" for s in IMAGE_SUFFIXES)
        image = next((p for p in candidates if p.is_file()), None)
        if image is None:
            raise TaskError(f"{root / 'JPEGImages'}: no image for {stem}")
        w, h, boxes = read_annotation(xml, classes)
        pub, priv = case_dirs(spec, out, stem)
        try:
            with Image.open(image) as im:
                if im.size != (w, h):
                    raise TaskError(f"{image}: size {im.size} differs from {xml.name}'s {w}x{h}")
                im.save(pub / spec.det.image_file)
        except (OSError, UnidentifiedImageError) as e:
            raise TaskError(f"{image}: not a readable image ({e})") from e
        (priv / spec.det.reference_file).write_text(
            json.dumps({"width": w, "height": h, "boxes": boxes}, indent=1)
        )
        if progress:
            progress(stem)
