"""Detection grader: mAP at IoU 0.5 over the data set (``scorer.metrics.detection``).

A prediction file with any bad box makes the case score 0 with the reason and count as "no
predictions" in the mAP (its reference boxes are misses), as in the public format checker, where
one bad box invalidates the file. The TASK is the data-set mAP, not a mean of case scores (AP ranks
detections across all images); the case score is that image's own AP, a diagnostic.
"""

from __future__ import annotations

import math
import reprlib
from pathlib import Path
from typing import Any, TypeGuard

import msgspec
import numpy as np

from schemas.task_spec import TaskError, TaskSpec
from schemas.untrusted_json import check_json_depth
from scorer.grader.gate import gated_score
from scorer.grader.options import GradeOptions
from scorer.grader.result import CaseResult, GradeResult, invalid_case, missing_case
from scorer.grader.submitted import Rejected, open_submitted
from scorer.metrics.detection import EMPTY, Boxes, DetParams, mean_average_precision, norm_class
from tasks.synth import reference_cases

MAX_FILE_BYTES = 20 * 1024 * 1024
MAX_BOXES = 10_000
"""More boxes than this in one image is refused rather than matched (keeps grading bounded)."""


class BadPrediction(ValueError):
    """A prediction file that cannot be scored; the message is the case's reason."""


def _number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_float(v: int | float) -> float:
    """A JSON number as a float. JSON integers decode to Python ints of any size (``10**400``),
    which ``float()`` refuses with OverflowError: such an integer is an infinity, refused as such."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def parse_boxes(raw: bytes, width: float | None, height: float | None, *, with_scores: bool = True) -> Boxes:
    """Validate and convert one ``{"boxes": [...]}`` document; the first problem is the error."""
    try:
        check_json_depth(raw)
        doc = msgspec.json.decode(raw)
    except (msgspec.DecodeError, ValueError) as e:
        raise BadPrediction(f"not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("boxes"), list):
        raise BadPrediction('must be a JSON object with a list field "boxes"')
    items = doc["boxes"]
    if len(items) > MAX_BOXES:
        raise BadPrediction(f"{len(items)} boxes; at most {MAX_BOXES} per image are accepted")
    labels, coords, scores = [], [], []
    for i, b in enumerate(items):
        if not isinstance(b, dict):
            raise BadPrediction(f"boxes[{i}] is not an object")
        missing = [k for k in ("class", "x1", "y1", "x2", "y2") if k not in b]
        if missing:
            raise BadPrediction(f"boxes[{i}] lacks {', '.join(missing)}")
        if not isinstance(b["class"], str) or not b["class"].strip():
            raise BadPrediction(f"boxes[{i}]: class must be a non-empty string")
        xy = [b[k] for k in ("x1", "y1", "x2", "y2")]
        if not all(_number(v) for v in xy):
            raise BadPrediction(f"boxes[{i}]: x1, y1, x2, y2 must be numbers")
        x1, y1, x2, y2 = (_as_float(v) for v in xy)
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
            raise BadPrediction(f"boxes[{i}]: coordinates must be finite numbers (within ±1.8e308)")
        if x2 <= x1 or y2 <= y1:
            raise BadPrediction(f"boxes[{i}]: x2 <= x1 or y2 <= y1 (empty or inverted box)")
        if x1 < 0 or y1 < 0 or (width is not None and x2 > width) or (height is not None and y2 > height):
            raise BadPrediction(
                f"boxes[{i}]: ({x1:g}, {y1:g}, {x2:g}, {y2:g}) is outside the {width:g}x{height:g} image"
                if width and height
                else f"boxes[{i}]: negative coordinate"
            )
        score = 1.0
        if with_scores and "score" in b:
            s = b["score"]
            if not _number(s) or not 0.0 <= _as_float(s) <= 1.0:  # NaN and infinities fail too
                # reprlib: the agent's value, cut short (a 400-digit integer, a long string)
                raise BadPrediction(f"boxes[{i}]: score must be a number in [0, 1], got {reprlib.repr(s)}")
            score = _as_float(s)
        labels.append(b["class"])
        coords.append((x1, y1, x2, y2))
        scores.append(score)
    return Boxes.of(labels, np.array(coords, dtype=np.float64).reshape(-1, 4), scores)


def _side(doc: dict[str, Any], key: str) -> float | None:
    """The reference's image ``width`` or ``height`` (None when it gives none: boxes are then
    bounded by 0 only); a number that is no finite float (``10**400``, ``1e400``), or zero or
    negative (no image has no pixels: every box would be refused), is refused."""
    v = doc.get(key)
    if not _number(v):
        return None
    side = _as_float(v)
    if not math.isfinite(side):
        raise BadPrediction(f"{key} must be a finite number (within ±1.8e308), got {reprlib.repr(v)}")
    if side <= 0:
        raise BadPrediction(f"{key} must be a positive number of pixels, got {reprlib.repr(v)}")
    return side


def load_reference(spec: TaskSpec, reference: Path, case: str) -> tuple[Boxes, float | None, float | None]:
    assert spec.det is not None
    path = reference / spec.private.case_dir.format(case=case) / spec.det.reference_file
    try:
        raw = path.read_bytes()
        doc = msgspec.json.decode(raw)
        w, h = _side(doc, "width"), _side(doc, "height")
        return parse_boxes(raw, w, h, with_scores=False), w, h
    except (OSError, msgspec.DecodeError, AttributeError, BadPrediction) as e:
        raise TaskError(f"reference {path}: unreadable ({e})") from e


def det_params(spec: TaskSpec, options: GradeOptions) -> DetParams:
    assert spec.det is not None
    return DetParams(
        iou_threshold=float(spec.metric.params.get("iou_threshold", 0.5)),
        interpolation=options.ap_interpolation,
        class_set=options.det_class_set,
        wildcard=spec.det.wildcard if options.det_wildcard else None,
    )


def _case_ap(ref: Boxes, pred: Boxes, params: DetParams) -> tuple[float, dict[str, Any]]:
    if not ref.labels and not pred.labels:
        return 1.0, {"n_gt": 0, "n_pred": 0}
    r = mean_average_precision([ref], [pred], params)
    return r.map, {
        "n_gt": len(ref.labels),
        "n_pred": len(pred.labels),
        "ap_by_class": {c: r.per_class[c].ap for c in r.classes},
    }


def grade_track(spec: TaskSpec, submission: Path, reference: Path, options: GradeOptions) -> GradeResult:
    det = spec.det
    assert det is not None  # decode_spec guarantees it for this track
    params = det_params(spec, options)
    ids = reference_cases(reference, det.reference_file)
    if not ids:
        raise TaskError(f"reference {reference}: no <case>/{det.reference_file} found")
    allowed = {norm_class(c) for c in spec.submission.classes}
    refs: dict[str, Boxes] = {}
    preds: dict[str, Boxes] = {}
    cases: list[CaseResult] = []
    for case in ids:
        ref, w, h = load_reference(spec, reference, case)
        refs[case], preds[case] = ref, EMPTY
        rel = f"{spec.submission.root}/{case}/{det.output_file}"
        try:
            f = open_submitted(submission, rel)
        except Rejected as e:
            if e.kind == "missing":
                cases.append(missing_case(case, f"{rel} is missing", n_gt=len(ref.labels)))
            else:
                cases.append(invalid_case(case, f"{rel}: {e}", n_gt=len(ref.labels)))
            continue
        try:
            with f:
                raw = f.read(MAX_FILE_BYTES + 1)
            if len(raw) > MAX_FILE_BYTES:
                raise BadPrediction(f"larger than {MAX_FILE_BYTES} bytes")
            pred = parse_boxes(raw, w, h)
        except (BadPrediction, OSError) as e:
            cases.append(invalid_case(case, f"{rel}: {e}", n_gt=len(ref.labels)))
            continue
        preds[case] = pred
        ap, details = _case_ap(ref, pred, params)
        unknown = sorted({lab for lab in pred.labels if lab not in allowed} - {norm_class(det.wildcard)})
        if unknown:
            details["classes_not_in_task"] = unknown
        cases.append(CaseResult(case=case, score=ap, details=details))

    last: dict[str, Any] = {}

    def aggregate(subset) -> float:
        names = [c.case for c in subset]
        r = mean_average_precision([refs[n] for n in names], [preds[n] for n in names], params)
        last["result"] = r
        return r.map

    score, checks = gated_score(cases, options, aggregate)
    r = last.get("result") or mean_average_precision(list(refs.values()), list(preds.values()), params)
    checks["map"] = r.map
    checks["medal_metric"] = r.map  # eval_det2d run_eval: the tier reads mAP before the gate
    checks["classes_in_mean"] = r.classes
    checks["per_class"] = {
        c: {"ap": a.ap, "n_gt": a.n_gt, "n_pred": a.n_pred} for c, a in r.per_class.items()
    }
    return GradeResult(
        task=spec.id,
        metric=spec.metric.name,
        score=score,
        cases=cases,
        params={
            **msgspec.to_builtins(params),
            "matching": "greedy by descending score, best unmatched reference with IoU >= threshold",
            "box_area": "continuous (x2-x1)*(y2-y1), no +1",
            "case_score": "the image's own AP under the same rules (diagnostic)",
            "completeness": options.completeness,
        },
        checks=checks,
    )
