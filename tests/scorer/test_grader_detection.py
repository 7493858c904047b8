"""Detection grader: perfect/empty twins, every malformed-file reason, options, pycocotools end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scorer.grader import grade
from scorer.grader.options import GradeOptions
from scorer.metrics.coco_reference import coco_ap
from scorer.metrics.detection import Boxes
from tasks.registry import load_spec
from tasks.synth import perfect_submission, synth
from tests.scorer.helpers import output_file

TASKS = ["bccd-det", "vindr-cxr-det", "grazpedwri-det", "dentex-det"]
CASES = ("case_00000", "case_00001", "case_00002")


@pytest.fixture(scope="module", params=TASKS)
def twin(request, make_twin):
    return load_spec(request.param), make_twin(request.param, 3, 5)


def pred_path(ws: Path, case: str) -> Path:
    return output_file(ws, case, "prediction.json")


def ref_boxes(data: Path, case: str) -> dict:
    return json.loads((data / "private" / case / "boxes.json").read_text())


@pytest.mark.parametrize(
    "options",
    [GradeOptions(), GradeOptions(ap_interpolation="coco_101", det_class_set="union")],
    ids=["paper", "code"],
)
def test_perfect_scores_one_and_empty_scores_zero(twin, tmp_path, options):
    spec, data = twin
    perfect_submission(spec, data, tmp_path / "good")
    r = grade(spec, tmp_path / "good", data / "private", options)
    assert r.score == 1.0 and all(c.score == 1.0 and c.reason is None for c in r.cases)
    assert r.params["iou_threshold"] == 0.5 and r.params["interpolation"] == options.ap_interpolation
    (tmp_path / "empty").mkdir()
    r = grade(spec, tmp_path / "empty", data / "private", options)
    assert r.score == 0.0 and all(
        c.status == "missing" and "prediction.json is missing" in (c.reason or "") for c in r.cases
    )


def _box(**kw):
    b = {"class": "x", "score": 0.5, "x1": 1.0, "y1": 1.0, "x2": 5.0, "y2": 5.0}
    b.update(kw)
    return {k: v for k, v in b.items() if v is not ...}


BAD = {
    "not-json": (b"{boxes: [", "not valid JSON"),
    "not-utf8": (b"\xff\xfe\x00{", "not valid JSON"),
    "list-top": (b"[]", 'list field "boxes"'),
    "no-boxes": (b'{"predictions": []}', 'list field "boxes"'),
    "box-not-object": (json.dumps({"boxes": [3]}).encode(), "not an object"),
    "missing-key": (json.dumps({"boxes": [_box(y2=...)]}).encode(), "lacks y2"),
    "empty-class": (json.dumps({"boxes": [_box(**{"class": " "})]}).encode(), "class must be"),
    "string-coord": (json.dumps({"boxes": [_box(x1="1")]}).encode(), "must be numbers"),
    "bool-coord": (json.dumps({"boxes": [_box(x1=True)]}).encode(), "must be numbers"),
    "inverted": (json.dumps({"boxes": [_box(x1=6.0)]}).encode(), "x2 <= x1"),
    "zero-width": (json.dumps({"boxes": [_box(x2=1.0)]}).encode(), "x2 <= x1"),
    "out-of-range": (json.dumps({"boxes": [_box(x2=100000.0)]}).encode(), "outside"),
    "negative": (json.dumps({"boxes": [_box(x1=-3.0)]}).encode(), "outside"),
    "nan-score": (
        b'{"boxes": [{"class": "x", "score": NaN, "x1": 1, "y1": 1, "x2": 5, "y2": 5}]}',
        "not valid JSON",
    ),
    "nan-coord": (b'{"boxes": [{"class": "x", "x1": NaN, "y1": 1, "x2": 5, "y2": 5}]}', "not valid JSON"),
    "huge-number": (b'{"boxes": [{"class": "x", "x1": 1e999, "y1": 1, "x2": 5, "y2": 5}]}', "out of range"),
    # JSON integers have no limit and decode to Python ints, which float() refuses (OverflowError)
    "huge-int-coord": (json.dumps({"boxes": [_box(x2=10**400)]}).encode(), "must be finite"),
    "huge-int-score": (json.dumps({"boxes": [_box(score=10**400)]}).encode(), "score must be"),
    "score-above-one": (json.dumps({"boxes": [_box(score=1.5)]}).encode(), "score must be"),
    "score-string": (json.dumps({"boxes": [_box(score="high")]}).encode(), "score must be"),
    "deep-nesting": (b"[" * 100_000 + b"]" * 100_000, "JSON"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_each_malformed_file_scores_zero_with_its_reason(twin, tmp_path, kind):
    spec, data = twin
    perfect_submission(spec, data, tmp_path)
    raw, reason = BAD[kind]
    pred_path(tmp_path, "case_00001").write_bytes(raw)
    r = grade(spec, tmp_path, data / "private")
    bad = {c.case: c for c in r.cases}["case_00001"]
    assert bad.status == "invalid" and bad.score == 0.0 and reason in (bad.reason or ""), bad.reason
    assert bad.reason is not None
    assert bad.reason.startswith("agents_outputs/case_00001/prediction.json: ")
    # the invalid case counts as no detections: its reference boxes are misses, so mAP drops
    assert r.score < 1.0


def test_missing_score_means_one_and_extra_keys_are_ignored(twin, tmp_path):
    spec, data = twin
    for case in CASES:
        boxes = [
            {**{k: b[k] for k in ("class", "x1", "y1", "x2", "y2")}, "note": "hi"}
            for b in ref_boxes(data, case)["boxes"]
        ]
        pred_path(tmp_path, case).write_text(json.dumps({"boxes": boxes, "model": "m"}))
    assert grade(spec, tmp_path, data / "private").score == 1.0


def test_class_names_are_case_insensitive_and_unknown_ones_are_reported(tmp_path):
    spec = load_spec("bccd-det")
    data = tmp_path / "d"
    synth(spec, data, 2, 0)
    for case in ("case_00000", "case_00001"):
        boxes = [{**b, "class": b["class"].upper(), "score": 0.9} for b in ref_boxes(data, case)["boxes"]]
        boxes.append({"class": "Neutrophil", "score": 0.1, "x1": 0, "y1": 0, "x2": 3, "y2": 3})
        pred_path(tmp_path / "ws", case).write_text(json.dumps({"boxes": boxes}))
    paper = grade(spec, tmp_path / "ws", data / "private")
    code = grade(spec, tmp_path / "ws", data / "private", GradeOptions(det_class_set="union"))
    assert paper.score == 1.0  # the spurious class has no reference: left out of the mean
    assert code.score < 1.0 and code.checks["per_class"]["neutrophil"]["ap"] == 0.0
    assert paper.cases[0].details["classes_not_in_task"] == ["neutrophil"]


def test_wildcard_option(tmp_path):
    spec = load_spec("bccd-det")
    data = tmp_path / "d"
    synth(spec, data, 2, 0)
    for case in ("case_00000", "case_00001"):
        boxes = [{**b, "class": "abnormality", "score": 0.9} for b in ref_boxes(data, case)["boxes"]]
        pred_path(tmp_path / "ws", case).write_text(json.dumps({"boxes": boxes}))
    on = grade(spec, tmp_path / "ws", data / "private")
    off = grade(spec, tmp_path / "ws", data / "private", GradeOptions(det_wildcard=False))
    assert on.score > 0.3 and off.score == 0.0


@pytest.mark.parametrize("gate,expected_zero", [("per_case_zero", False), ("all_or_nothing", True)])
def test_completeness_gate(twin, tmp_path, gate, expected_zero):
    spec, data = twin
    perfect_submission(spec, data, tmp_path)
    pred_path(tmp_path, "case_00002").unlink()
    r = grade(spec, tmp_path, data / "private", GradeOptions(completeness=gate))
    assert (r.score == 0.0) == expected_zero and r.checks["n_missing"] == 1


def test_times_completion_scores_the_completed_images(twin, tmp_path):
    spec, data = twin
    perfect_submission(spec, data, tmp_path)
    pred_path(tmp_path, "case_00002").unlink()
    r = grade(spec, tmp_path, data / "private", GradeOptions(completeness="times_completion"))
    assert r.score == pytest.approx(2 / 3)  # mAP 1 over the two submitted images × 2/3


def test_end_to_end_against_pycocotools(tmp_path):
    spec = load_spec("bccd-det")
    data = tmp_path / "d"
    synth(spec, data, 12, 3)
    rng = np.random.default_rng(0)
    refs, preds = [], []
    for i in range(12):
        case = f"case_{i:05d}"
        ref = ref_boxes(data, case)
        boxes = []
        for b in ref["boxes"]:
            if rng.random() < 0.2:
                continue  # a miss
            j = rng.normal(0, 3, 4)
            x1, y1 = max(0.0, b["x1"] + j[0]), max(0.0, b["y1"] + j[1])
            x2, y2 = min(ref["width"], b["x2"] + j[2]), min(ref["height"], b["y2"] + j[3])
            if x2 > x1 + 1 and y2 > y1 + 1:
                boxes.append(
                    {
                        "class": b["class"],
                        "score": float(rng.random()),
                        "x1": x1,
                        "y1": y1,
                        "x2": x2,
                        "y2": y2,
                    }
                )
        boxes.append(
            {"class": "RBC", "score": float(rng.random()), "x1": 3.0, "y1": 3.0, "x2": 40.0, "y2": 40.0}
        )
        pred_path(tmp_path / "ws", case).write_text(json.dumps({"boxes": boxes}))
        refs.append(
            Boxes.of(
                [b["class"] for b in ref["boxes"]],
                [[b[k] for k in ("x1", "y1", "x2", "y2")] for b in ref["boxes"]],
            )
        )
        preds.append(
            Boxes.of(
                [b["class"] for b in boxes],
                [[b[k] for k in ("x1", "y1", "x2", "y2")] for b in boxes],
                [b["score"] for b in boxes],
            )
        )
    r = grade(spec, tmp_path / "ws", data / "private", GradeOptions(ap_interpolation="coco_101"))
    theirs = coco_ap(refs, preds, rec_thrs=np.arange(101) / 100)
    expected = np.mean([v for v in theirs.values() if v is not None])
    assert 0.2 < r.score < 1.0 and r.score == pytest.approx(expected, abs=1e-12)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=5),
    max_leaves=20,
)
box_like = st.fixed_dictionaries(
    {
        "class": st.one_of(st.sampled_from(["RBC", "WBC", "platelets", "", "abnormality"]), json_values),
        "x1": st.one_of(st.floats(-50, 400), json_values),
        "y1": st.floats(-50, 400),
        "x2": st.one_of(st.floats(-50, 400), json_values),
        "y2": st.floats(-50, 400),
    },
    optional={"score": st.one_of(st.floats(-1, 2), json_values)},
)
documents = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.lists(box_like, max_size=6).map(lambda bs: json.dumps({"boxes": bs}).encode()),
    st.lists(box_like, max_size=6).map(lambda bs: json.dumps({"boxes": bs}).encode()[:-3]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.one_of(st.none(), documents), min_size=3, max_size=3),
    gate=st.sampled_from(["per_case_zero", "all_or_nothing", "times_completion"]),
    interp=st.sampled_from(["voc_all_point", "coco_101"]),
)
def test_property_malformed_predictions_never_crash(tmp_path_factory, make_twin, files, gate, interp):
    spec = load_spec("bccd-det")
    data = make_twin("bccd-det", 3, 4)
    ws = tmp_path_factory.mktemp("ws")
    for case, raw in zip(CASES, files, strict=False):
        if raw is not None:
            pred_path(ws, case).write_bytes(raw)
    r = grade(spec, ws, data / "private", GradeOptions(completeness=gate, ap_interpolation=interp))
    assert 0.0 <= r.score <= 1.0 and len(r.cases) == 3
    for c in r.cases:
        assert 0.0 <= c.score <= 1.0
        assert (c.status == "scored") == (c.reason is None)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"width": 10**400}, "width must be a finite number (within ±1.8e308), got 1000"),
        ({"height": -(10**400)}, "height must be a finite number"),
        ({"boxes": [{"class": "RBC", "x1": 0, "y1": 0, "x2": 10**400, "y2": 5}]}, "boxes[0]: coordinates"),
        ({"boxes": [{"class": 2**70, "x1": 0, "y1": 0, "x2": 5, "y2": 5}]}, "boxes[0]: class must be"),
        ({"width": 0}, "width must be a positive number of pixels, got 0"),
        ({"height": -480}, "height must be a positive number of pixels, got -480"),
        ({"width": -0.5, "boxes": []}, "width must be a positive number of pixels, got -0.5"),
    ],
    ids=[
        "huge-width",
        "huge-negative-height",
        "huge-coordinate",
        "integer-class",
        "zero-width",
        "negative-height",
        "negative-width-no-boxes",
    ],
)
def test_a_reference_with_an_unusable_number_is_one_clear_error(tmp_path, change, reason):
    """The references are the grader's input too: a number no float holds, or an image size of zero
    or less, is one error line that names the file and the field, with a non-zero exit, never an
    OverflowError's traceback nor every box refused as out of the image."""
    import subprocess
    import sys

    spec = load_spec("bccd-det")
    data = tmp_path / "d"
    synth(spec, data, 2, 0)
    perfect_submission(spec, data, tmp_path / "ws")
    ref = data / "private" / "case_00001" / "boxes.json"
    ref.write_text(json.dumps({**json.loads(ref.read_text()), **change}))
    args = ["bccd-det", "--submission", str(tmp_path / "ws"), "--reference", str(data / "private")]
    proc = subprocess.run(
        [sys.executable, "-m", "scorer.grader", *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"amb: error: reference {ref}: unreadable (")
    assert reason in proc.stderr
