"""Detection twins: PNG images, boxes inside them with the task's classes, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from tasks.registry import load_spec
from tasks.synth import synth
from tests.tasks.helpers import twin_is_deterministic

TASKS = ["bccd-det", "vindr-cxr-det", "grazpedwri-det", "dentex-det"]


@pytest.mark.parametrize("task", TASKS)
def test_layout_boxes_and_determinism(tmp_path, task):
    spec = load_spec(task)
    twin_is_deterministic(spec, tmp_path, 4, 3)
    assert spec.det is not None
    lo, hi = spec.det.synth_boxes
    for case in sorted((tmp_path / "a" / "public").iterdir()):
        with Image.open(case / "image.png") as im:
            assert im.format == "PNG"
            w, h = im.size
            pixels = np.asarray(im)
        assert (h, w) == tuple(spec.det.synth_shape) and pixels.std() > 5  # not a blank image
        ref = json.loads((tmp_path / "a" / "private" / case.name / "boxes.json").read_text())
        assert (ref["width"], ref["height"]) == (w, h)
        assert 1 <= len(ref["boxes"]) <= hi
        for b in ref["boxes"]:
            assert b["class"] in spec.submission.classes
            assert 0 <= b["x1"] < b["x2"] <= w and 0 <= b["y1"] < b["y2"] <= h


def test_boxes_sit_on_objects(tmp_path):
    # A box's inside differs from the image around it: the object is drawn where the box says.
    spec = load_spec("vindr-cxr-det")
    synth(spec, tmp_path, 6, 1)
    diffs = []
    for case in sorted((tmp_path / "public").iterdir()):
        img = np.asarray(Image.open(case / "image.png"), dtype=np.float64)
        for b in json.loads((tmp_path / "private" / case.name / "boxes.json").read_text())["boxes"]:
            x1, y1, x2, y2 = (int(b[k]) for k in ("x1", "y1", "x2", "y2"))
            inside = img[y1:y2, x1:x2].mean()
            ring = img[max(0, y1 - 6) : y2 + 6, max(0, x1 - 6) : x2 + 6].mean()
            diffs.append(inside - ring)
    assert np.mean(diffs) > 3  # opacities are brighter than the lung around them


def test_every_class_appears_over_enough_cases(tmp_path):
    spec = load_spec("dentex-det")
    synth(spec, tmp_path, 12, 0)
    seen = {
        b["class"]
        for p in (tmp_path / "private").iterdir()
        for b in json.loads((p / "boxes.json").read_text())["boxes"]
    }
    assert seen == set(spec.submission.classes)
