"""mAP at one IoU threshold for 2-D box detection, our own implementation (numpy).

Its conventions are each pinned in ``DetParams``, echoed with the score, and described in
docs/enhancement-and-detection.md. The 101 recall thresholds of ``coco_101`` are compared exactly in
integers (``100·tp >= k·n_gt``): pycocotools' ``np.linspace`` puts ten of them one ulp above k/100.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import msgspec
import numpy as np

Interpolation = Literal["voc_all_point", "coco_101"]
ClassSet = Literal["union", "with_gt"]


class DetParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    iou_threshold: float = 0.5
    interpolation: Interpolation = "voc_all_point"
    class_set: ClassSet = "union"
    wildcard: str | None = "abnormality"
    """A class name that matches every class; None turns the rule off."""


DEFAULT_PARAMS = DetParams()


class Boxes(NamedTuple):
    """The boxes of one image: labels, an (n, 4) float64 xyxy array, and scores (all 1 for references)."""

    labels: tuple[str, ...]
    xyxy: np.ndarray
    scores: np.ndarray

    @classmethod
    def of(cls, labels: Sequence[str], xyxy, scores=None) -> Boxes:
        arr = np.asarray(xyxy, dtype=np.float64).reshape(-1, 4)
        sc = np.ones(len(arr)) if scores is None else np.asarray(scores, dtype=np.float64).reshape(-1)
        if len(labels) != len(arr) or len(sc) != len(arr):
            raise ValueError(f"{len(labels)} labels, {len(arr)} boxes and {len(sc)} scores")
        return cls(tuple(norm_class(c) for c in labels), arr, sc)


EMPTY = Boxes((), np.zeros((0, 4)), np.zeros(0))


class ClassAP(NamedTuple):
    ap: float
    n_gt: int
    n_pred: int
    n_tp: int


class MapResult(NamedTuple):
    map: float
    per_class: dict[str, ClassAP]
    classes: list[str]
    """The classes that entered the mean, sorted."""


def norm_class(name: str) -> str:
    return str(name).strip().lower()


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` (n, 4) with every box in ``b`` (m, 4); 0 where the union is empty."""
    ix1 = np.maximum(a[:, None, 0], b[None, :, 0])
    iy1 = np.maximum(a[:, None, 1], b[None, :, 1])
    ix2 = np.minimum(a[:, None, 2], b[None, :, 2])
    iy2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(ix2 - ix1, 0, None) * np.clip(iy2 - iy1, 0, None)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    out = np.zeros_like(inter)
    np.divide(inter, union, out=out, where=union > 0)
    return out


def match_image(
    gt: np.ndarray, pred: np.ndarray, pred_scores: np.ndarray, iou_threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy matching in one image and class. Returns (scores, tp flags) in descending-score order."""
    order = np.argsort(-pred_scores, kind="stable")
    tp = np.zeros(len(order), dtype=bool)
    if len(gt) and len(order):
        ious = iou_matrix(pred[order], gt)
        ious[ious < iou_threshold] = -1.0
        for i in range(len(order)):
            j = int(np.argmax(ious[i]))  # first of equal maxima: the public code's strict ">"
            if ious[i, j] >= 0.0:
                tp[i] = True
                ious[:, j] = -1.0
    return pred_scores[order], tp


def average_precision(tp_sorted: np.ndarray, n_gt: int, interpolation: Interpolation) -> float:
    """AP from true-positive flags in descending-score order; 0 when there is no reference box."""
    if n_gt == 0 or len(tp_sorted) == 0:
        return 0.0
    ctp = np.cumsum(tp_sorted, dtype=np.int64)
    cfp = np.arange(1, len(tp_sorted) + 1, dtype=np.int64) - ctp
    precision = ctp / (ctp + cfp)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    if interpolation == "coco_101":
        k = np.arange(101, dtype=np.int64)
        # first detection index whose recall reaches k/100, in exact integer arithmetic
        first = np.searchsorted(100 * ctp, k * n_gt, side="left")
        reached = first < len(ctp)
        return float(np.where(reached, envelope[np.minimum(first, len(ctp) - 1)], 0.0).sum() / 101.0)
    if interpolation == "voc_all_point":
        recall = ctp / n_gt
        steps = np.diff(np.concatenate(([0.0], recall)))
        return float(np.sum(steps * envelope))
    raise ValueError(f"unknown AP interpolation {interpolation!r}")


def _members(labels: tuple[str, ...], cls: str, wildcard: str | None) -> np.ndarray:
    return np.array(
        [lab == cls or (wildcard is not None and (lab == wildcard or cls == wildcard)) for lab in labels],
        dtype=bool,
    )


def mean_average_precision(
    references: Sequence[Boxes], predictions: Sequence[Boxes], params: DetParams = DEFAULT_PARAMS
) -> MapResult:
    """mAP over images paired by position (``references[i]`` with ``predictions[i]``)."""
    if len(references) != len(predictions):
        raise ValueError(f"{len(references)} reference images but {len(predictions)} prediction images")
    wc = norm_class(params.wildcard) if params.wildcard else None
    named = {lab for b in (*references, *predictions) for lab in b.labels}
    per_class: dict[str, ClassAP] = {}
    for cls in sorted(named):
        scores, flags, n_gt = [], [], 0
        for ref, pred in zip(references, predictions, strict=False):
            g = ref.xyxy[_members(ref.labels, cls, wc)] if ref.labels else ref.xyxy[:0]
            pm = _members(pred.labels, cls, wc) if pred.labels else np.zeros(0, dtype=bool)
            n_gt += len(g)
            if pm.any():
                s, t = match_image(g, pred.xyxy[pm], pred.scores[pm], params.iou_threshold)
                scores.append(s)
                flags.append(t)
        all_scores = np.concatenate(scores) if scores else np.zeros(0)
        all_tp = np.concatenate(flags) if flags else np.zeros(0, dtype=bool)
        tp_sorted = all_tp[np.argsort(-all_scores, kind="stable")]
        per_class[cls] = ClassAP(
            average_precision(tp_sorted, n_gt, params.interpolation), n_gt, len(all_tp), int(all_tp.sum())
        )
    classes = [c for c, r in per_class.items() if params.class_set != "with_gt" or r.n_gt > 0]
    m = float(np.mean([per_class[c].ap for c in classes])) if classes else 0.0
    return MapResult(m, per_class, classes)
