"""mAP@0.5: hand-computed fixtures for each rule, and pycocotools as the independent reference."""

from __future__ import annotations

import numpy as np
import pytest

from scorer.metrics.coco_reference import coco_ap
from scorer.metrics.detection import (
    EMPTY,
    Boxes,
    DetParams,
    average_precision,
    iou_matrix,
    mean_average_precision,
)

VOC = DetParams(interpolation="voc_all_point", wildcard=None)
COCO = DetParams(interpolation="coco_101", wildcard=None)


def B(*rows, scores=None):
    """Boxes from (class, x1, y1, x2, y2) rows."""
    return Boxes.of([r[0] for r in rows], [r[1:] for r in rows], scores)


def test_iou_by_hand():
    a = np.array([[0, 0, 2, 2]], float)
    b = np.array([[1, 1, 3, 3], [0, 0, 2, 2], [5, 5, 6, 6], [0, 0, 2, 1]], float)
    assert iou_matrix(a, b).tolist() == [[1 / 7, 1.0, 0.0, 0.5]]


# Two reference boxes; detections at 0.9 (hit), 0.8 (miss), 0.7 (hit):
# precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1.
TP_FLAGS = np.array([True, False, True])


def test_voc_all_point_by_hand():
    # envelope 1, 2/3, 2/3 -> 0.5 * 1 + 0.5 * 2/3
    assert average_precision(TP_FLAGS, 2, "voc_all_point") == pytest.approx(0.5 + 1 / 3, abs=1e-15)


def test_coco_101_by_hand():
    # recall thresholds 0.00..0.50 (51 points) see precision 1; 0.51..1.00 (50 points) see 2/3
    assert average_precision(TP_FLAGS, 2, "coco_101") == pytest.approx((51 + 50 * 2 / 3) / 101, abs=1e-15)


def test_ap_edge_cases():
    assert average_precision(np.array([], bool), 3, "voc_all_point") == 0.0
    assert average_precision(np.array([True]), 0, "coco_101") == 0.0  # no reference: 0, public code
    assert average_precision(np.array([False, False]), 2, "voc_all_point") == 0.0
    assert average_precision(np.array([True, True]), 2, "coco_101") == 1.0


def test_recall_thresholds_are_exact_k_over_100():
    # 10 references, 7 found first, then 3 false positives: recall reaches 0.7 exactly.
    flags = np.array([True] * 7 + [False] * 3)
    ours = average_precision(flags, 10, "coco_101")
    assert ours == pytest.approx(71 / 101, abs=1e-15)  # thresholds 0.00..0.70 see precision 1
    refs = [B(*[("a", 10 * i, 0, 10 * i + 5, 5) for i in range(10)])]
    preds = [
        B(
            *[("a", 10 * i, 0, 10 * i + 5, 5) for i in range(7)],
            *[("a", 200 + 10 * i, 0, 205 + 10 * i, 5) for i in range(3)],
            scores=[0.9] * 7 + [0.1] * 3,
        )
    ]
    # pycocotools' own np.linspace thresholds put 0.7 one ulp too high and miss it ...
    assert coco_ap(refs, preds)["a"] == pytest.approx(70 / 101, abs=1e-12)
    # ... with the k/100 thresholds (the public code's) it agrees with us.
    assert coco_ap(refs, preds, rec_thrs=np.arange(101) / 100)["a"] == pytest.approx(ours, abs=1e-12)


def test_iou_exactly_at_threshold_matches():
    refs = [B(("a", 0, 0, 2, 1))]
    preds = [B(("a", 0, 0, 1, 1))]  # IoU 0.5
    assert mean_average_precision(refs, preds, VOC).map == 1.0
    assert mean_average_precision(refs, preds, DetParams(iou_threshold=0.51, wildcard=None)).map == 0.0


def test_duplicate_detection_is_a_false_positive():
    refs = [B(("a", 0, 0, 10, 10))]
    preds = [B(("a", 0, 0, 10, 10), ("a", 0, 0, 10, 10), scores=[0.9, 0.8])]
    r = mean_average_precision(refs, preds, VOC)
    assert r.map == 1.0 and r.per_class["a"].n_tp == 1 and r.per_class["a"].n_pred == 2
    preds = [B(("a", 0, 0, 10, 10), ("a", 0, 0, 10, 10), scores=[0.8, 0.9])]
    assert mean_average_precision(refs, preds, VOC).map == 1.0


def test_greedy_takes_best_unmatched_reference():
    # The high-score detection overlaps both references, more the first; the second detection then
    # takes the other reference (a VOC-devkit matcher would call it a duplicate).
    refs = [B(("a", 0, 0, 10, 10), ("a", 2, 0, 12, 10))]
    preds = [B(("a", 1, 0, 11, 10), ("a", 0, 0, 10, 10), scores=[0.9, 0.8])]
    assert mean_average_precision(refs, preds, VOC).per_class["a"].n_tp == 2


def test_ranking_is_across_images():
    refs = [B(("a", 0, 0, 10, 10)), B(("a", 0, 0, 10, 10))]
    preds = [B(("a", 50, 50, 60, 60), scores=[0.95]), B(("a", 0, 0, 10, 10), scores=[0.5])]
    # order: FP (0.95), TP (0.5): precision 1/2 at recall 1/2 -> VOC 0.25
    assert mean_average_precision(refs, preds, VOC).map == pytest.approx(0.25)


def test_missing_predictions_and_classes():
    refs = [B(("a", 0, 0, 10, 10), ("b", 20, 20, 30, 30))]
    preds = [B(("a", 0, 0, 10, 10))]
    r = mean_average_precision(refs, preds, VOC)
    assert r.per_class["b"].ap == 0.0 and r.map == 0.5 and r.classes == ["a", "b"]


def test_class_set_union_counts_spurious_classes():
    refs = [B(("rbc", 0, 0, 10, 10))]
    preds = [B(("RBC ", 0, 0, 10, 10), ("tumour", 30, 30, 40, 40))]  # case and blanks are normalised
    union = mean_average_precision(refs, preds, DetParams(class_set="union", wildcard=None))
    with_gt = mean_average_precision(refs, preds, DetParams(class_set="with_gt", wildcard=None))
    assert union.map == 0.5 and union.classes == ["rbc", "tumour"]
    assert with_gt.map == 1.0 and with_gt.classes == ["rbc"]


def test_wildcard_matches_every_class():
    refs = [B(("rbc", 0, 0, 10, 10), ("wbc", 20, 20, 30, 30))]
    preds = [B(("abnormality", 0, 0, 10, 10), ("abnormality", 20, 20, 30, 30), scores=[0.9, 0.8])]
    on = mean_average_precision(refs, preds, DetParams(wildcard="abnormality", class_set="with_gt"))
    # Wildcard detections enter every class's ranking (the public rule):
    # rbc: hit then miss -> AP 1; wbc: miss then hit -> precision 1/2 at recall 1 -> VOC AP 0.5;
    # the class "abnormality" itself takes every reference: two hits -> AP 1.
    assert on.per_class["rbc"].ap == 1.0 and on.per_class["wbc"].ap == 0.5
    assert on.per_class["abnormality"].n_gt == 2 and on.per_class["abnormality"].ap == 1.0
    assert on.map == pytest.approx(2.5 / 3)
    off = mean_average_precision(refs, preds, DetParams(wildcard=None, class_set="with_gt"))
    assert off.map == 0.0 and off.classes == ["rbc", "wbc"]


def test_no_classes_at_all_is_zero():
    assert mean_average_precision([EMPTY], [EMPTY], VOC).map == 0.0
    assert mean_average_precision([], [], VOC).classes == []


def test_refuses_unpaired_images():
    with pytest.raises(ValueError, match="reference images"):
        mean_average_precision([EMPTY], [], VOC)


def random_set(seed: int, n_images: int = 25, classes=("a", "b", "c")):
    rng = np.random.default_rng(seed)
    refs, preds = [], []
    for _ in range(n_images):
        n = int(rng.integers(0, 6))
        xy = rng.uniform(0, 300, (n, 2))
        g = np.hstack([xy, xy + rng.uniform(8, 60, (n, 2))])
        labels = [classes[k] for k in rng.integers(0, len(classes), n)]
        refs.append(Boxes.of(labels, g))
        keep = rng.random(n) < 0.8  # some misses
        jit = g[keep] + rng.normal(0, 4, (int(keep.sum()), 4))
        jit[:, 2:] = np.maximum(jit[:, 2:], jit[:, :2] + 1)  # valid boxes only
        m = int(rng.integers(0, 4))  # false positives
        xy = rng.uniform(0, 300, (m, 2))
        fp = np.hstack([xy, xy + rng.uniform(8, 60, (m, 2))])
        plabels = [lab for lab, k in zip(labels, keep, strict=False) if k] + [
            classes[k] for k in rng.integers(0, len(classes), m)
        ]
        preds.append(Boxes.of(plabels, np.vstack([jit, fp]), rng.uniform(0, 1, len(plabels))))
    return refs, preds


@pytest.mark.parametrize("seed", range(8))
def test_coco_101_matches_pycocotools(seed):
    refs, preds = random_set(seed)
    ours = mean_average_precision(
        refs, preds, DetParams(interpolation="coco_101", class_set="with_gt", wildcard=None)
    )
    theirs = coco_ap(refs, preds, rec_thrs=np.arange(101) / 100)
    assert sorted(c for c, v in theirs.items() if v is not None) == ours.classes
    for c in ours.classes:
        assert ours.per_class[c].ap == pytest.approx(theirs[c], abs=1e-12), c
    assert ours.map == pytest.approx(np.mean([theirs[c] for c in ours.classes]), abs=1e-12)


def voc_devkit_ap(tp: np.ndarray, n_gt: int) -> float:
    """The PASCAL VOC 2010+ devkit's AP, written out independently (sentinels, envelope, steps)."""
    ctp = np.cumsum(tp)
    rec = ctp / n_gt
    prec = ctp / np.arange(1, len(tp) + 1)
    mrec = np.concatenate(([0.0], rec, [1.0]))
    mpre = np.concatenate(([0.0], prec, [0.0]))
    for i in range(len(mpre) - 2, -1, -1):
        mpre[i] = max(mpre[i], mpre[i + 1])
    idx = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1]))


@pytest.mark.parametrize("seed", range(20))
def test_voc_all_point_matches_the_devkit_formula(seed):
    rng = np.random.default_rng(seed)
    n_gt = int(rng.integers(1, 30))
    tp = rng.random(int(rng.integers(1, 60))) < 0.5
    tp[np.cumsum(tp) > n_gt] = False  # cannot find more than exist
    assert average_precision(tp, n_gt, "voc_all_point") == pytest.approx(voc_devkit_ap(tp, n_gt), abs=1e-12)


def test_union_rule_equals_pycocotools_plus_zeros():
    refs, preds = random_set(3, classes=("a", "b"))
    preds[0] = Boxes.of(
        [*preds[0].labels, "ghost"],
        np.vstack([preds[0].xyxy, [[0, 0, 5, 5]]]),
        np.append(preds[0].scores, 0.5),
    )
    ours = mean_average_precision(
        refs, preds, DetParams(interpolation="coco_101", class_set="union", wildcard=None)
    )
    theirs = coco_ap(refs, preds, rec_thrs=np.arange(101) / 100)
    assert theirs["ghost"] is None and ours.per_class["ghost"].ap == 0.0
    assert theirs["a"] is not None and theirs["b"] is not None
    assert ours.map == pytest.approx((theirs["a"] + theirs["b"] + 0.0) / 3, abs=1e-12)
