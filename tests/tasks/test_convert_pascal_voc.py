"""The Pascal VOC (BCCD) converter on a tiny fixture built in BCCD's own layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from schemas.task_spec import TaskError
from scorer.grader import grade
from tasks.convert import prepare
from tasks.registry import load_spec
from tasks.synth import perfect_submission

VOC_XML = """<annotation>
\t<folder>JPEGImages</folder>
\t<filename>{stem}.jpg</filename>
\t<size><width>{w}</width><height>{h}</height><depth>3</depth></size>
\t<segmented>0</segmented>
{objects}</annotation>
"""
OBJ = """\t<object>
\t\t<name>{name}</name><pose>Unspecified</pose><truncated>0</truncated><difficult>0</difficult>
\t\t<bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox>
\t</object>
"""


def make_bccd(root: Path, images: dict[str, list[tuple]], test: list[str] | None, w=64, h=48) -> Path:
    base = root / "BCCD_Dataset" / "BCCD"
    (base / "Annotations").mkdir(parents=True)
    (base / "JPEGImages").mkdir()
    for stem, objs in images.items():
        xml = VOC_XML.format(
            stem=stem,
            w=w,
            h=h,
            objects="".join(OBJ.format(name=n, x1=a, y1=b, x2=c, y2=d) for n, a, b, c, d in objs),
        )
        (base / "Annotations" / f"{stem}.xml").write_text(xml)
        rgb = np.random.default_rng(len(stem)).integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(base / "JPEGImages" / f"{stem}.jpg")
    if test is not None:
        (base / "ImageSets" / "Main").mkdir(parents=True)
        (base / "ImageSets" / "Main" / "test.txt").write_text("\n".join(test) + "\n")
    return root / "BCCD_Dataset"


def test_converts_the_test_split_with_voc_coordinates(tmp_path):
    src = make_bccd(
        tmp_path,
        {
            "BloodImage_00001": [("RBC", 1, 1, 20, 10), ("WBC", 30, 20, 70, 47)],  # xmax beyond width 64
            "BloodImage_00002": [("Platelets", 5, 5, 9, 9), ("rbc", 10, 10, 8, 20)],  # inverted: dropped
            "BloodImage_00003": [("RBC", 2, 2, 8, 8)],
        },
        test=["BloodImage_00001", "BloodImage_00002"],
    )
    spec = load_spec("bccd-det")
    seen: list[str] = []
    prepare(spec, src, tmp_path / "out", progress=seen.append)
    cases = sorted(p.name for p in (tmp_path / "out" / "private").iterdir())
    assert cases == seen == ["BloodImage_00001", "BloodImage_00002"]
    ref = json.loads((tmp_path / "out/private/BloodImage_00001/boxes.json").read_text())
    assert ref["width"] == 64 and ref["height"] == 48
    assert ref["boxes"] == [
        {"class": "RBC", "x1": 0.0, "y1": 0.0, "x2": 20.0, "y2": 10.0},
        {"class": "WBC", "x1": 29.0, "y1": 19.0, "x2": 64.0, "y2": 47.0},
    ]
    ref2 = json.loads((tmp_path / "out/private/BloodImage_00002/boxes.json").read_text())
    assert [b["class"] for b in ref2["boxes"]] == ["Platelets"]
    with Image.open(tmp_path / "out/public/BloodImage_00001/image.png") as im:
        assert im.format == "PNG" and im.size == (64, 48)
    # the converted set grades like a twin
    perfect_submission(spec, tmp_path / "out", tmp_path / "ws")
    assert grade(spec, tmp_path / "ws", tmp_path / "out" / "private").score == 1.0


def test_without_a_split_converts_everything(tmp_path):
    src = make_bccd(tmp_path, {"a": [("RBC", 1, 1, 5, 5)], "b": [("WBC", 1, 1, 5, 5)]}, test=None)
    prepare(load_spec("bccd-det"), src / "BCCD", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "public").iterdir()) == ["a", "b"]


@pytest.mark.parametrize(
    "break_it,match",
    [
        (
            lambda base: (base / "Annotations" / "a.xml").write_text("<annotation><size>"),
            "not readable VOC XML",
        ),
        (lambda base: (base / "JPEGImages" / "a.jpg").unlink(), "no image for a"),
        (lambda base: (base / "JPEGImages" / "a.jpg").write_bytes(b"junk"), "not a readable image"),
        (
            lambda base: (base / "Annotations" / "a.xml").write_text(
                VOC_XML.format(
                    stem="a", w=64, h=48, objects=OBJ.format(name="Neutrophil", x1=1, y1=1, x2=5, y2=5)
                )
            ),
            "class 'Neutrophil'",
        ),
    ],
    ids=["bad-xml", "no-image", "bad-image", "unknown-class"],
)
def test_broken_sources_are_one_clear_error(tmp_path, break_it, match):
    src = make_bccd(tmp_path, {"a": [("RBC", 1, 1, 5, 5)]}, test=None)
    break_it(src / "BCCD")
    with pytest.raises(TaskError, match=match):
        prepare(load_spec("bccd-det"), src, tmp_path / "out")


def test_not_a_voc_folder(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(TaskError, match="no Annotations"):
        prepare(load_spec("bccd-det"), tmp_path / "src", tmp_path / "out")


@pytest.mark.parametrize(
    ("w", "box", "field"),
    [
        (10**400, (1, 1, 5, 5), "<width>"),
        ("nan", (1, 1, 5, 5), "<width>"),
        (64, (1, 1, 10**400, 5), "<xmax>"),
        (64, (1, "-1e400", 5, 5), "<ymin>"),
    ],
    ids=["huge-width", "nan-width", "huge-xmax", "minus-infinite-ymin"],
)
def test_a_number_no_float_holds_is_one_clear_error(tmp_path, w, box, field):
    """An annotation's number of 400 digits (an infinity as a float) or NaN: an error naming the
    file and the element, never an OverflowError from int()."""
    src = make_bccd(tmp_path, {"a": [("RBC", 1, 1, 5, 5)]}, test=None)
    objects = OBJ.format(name="RBC", x1=box[0], y1=box[1], x2=box[2], y2=box[3])
    (src / "BCCD" / "Annotations" / "a.xml").write_text(VOC_XML.format(stem="a", w=w, h=48, objects=objects))
    with pytest.raises(TaskError, match=rf"a\.xml: {field} is not a finite number"):
        prepare(load_spec("bccd-det"), src, tmp_path / "out")


@pytest.mark.parametrize(
    ("w", "h", "field", "said"),
    [("64.7", 48, "width", "'64.7'"), (64, "47.5", "height", "'47.5'"), (64, "0", "height", "'0'")],
    ids=["fractional-width", "fractional-height", "zero-height"],
)
def test_an_image_size_that_is_no_whole_number_of_pixels_is_one_clear_error(tmp_path, w, h, field, said):
    """A fractional <width> or <height> is refused naming the file and the element, never cut to the
    integer below it (which an image of that size would then match)."""
    src = make_bccd(tmp_path, {"a": [("RBC", 1, 1, 5, 5)]}, test=None)
    objects = OBJ.format(name="RBC", x1=1, y1=1, x2=5, y2=5)
    (src / "BCCD" / "Annotations" / "a.xml").write_text(VOC_XML.format(stem="a", w=w, h=h, objects=objects))
    with pytest.raises(TaskError) as e:
        prepare(load_spec("bccd-det"), src, tmp_path / "out")
    xml = src / "BCCD" / "Annotations" / "a.xml"
    assert str(e.value) == f"{xml}: <{field}> is not a whole, positive number of pixels ({said})"


def test_a_size_written_with_a_zero_fraction_is_the_whole_number(tmp_path):
    src = make_bccd(tmp_path, {"a": [("RBC", 1, 1, 5, 5)]}, test=None)
    objects = OBJ.format(name="RBC", x1=1, y1=1, x2=5, y2=5)
    (src / "BCCD" / "Annotations" / "a.xml").write_text(
        VOC_XML.format(stem="a", w="64.0", h="48.0", objects=objects)
    )
    prepare(load_spec("bccd-det"), src, tmp_path / "out")
    ref = json.loads((tmp_path / "out/private/a/boxes.json").read_text())
    assert (ref["width"], ref["height"]) == (64, 48)
