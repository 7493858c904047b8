"""pycocotools as an independent reference for ``scorer.metrics.detection`` (tests and bench only).

pycocotools prints from ``evaluate``/``accumulate``/``summarize`` and returns positional arrays with
-1 sentinels, so it is wrapped once here: stdout silenced, IoU threshold, recall thresholds and the
per-image detection cap pinned, and per-class AP returned by class name (None for a class without
reference boxes, COCO's -1). It knows neither the wildcard class nor the ``union`` class rule.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from scorer.metrics.detection import Boxes


def coco_ap(
    references: Sequence[Boxes],
    predictions: Sequence[Boxes],
    *,
    iou_threshold: float = 0.5,
    rec_thrs: np.ndarray | None = None,
) -> dict[str, float | None]:
    """Per-class AP by pycocotools' COCOeval (bbox, one IoU threshold, all areas, no detection cap).

    ``rec_thrs`` defaults to COCO's own ``np.linspace(0, 1, 101)``; pass ``np.arange(101) / 100`` for
    the exact k/100 thresholds.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    names = sorted({lab for b in (*references, *predictions) for lab in b.labels})
    cat_id = {n: i + 1 for i, n in enumerate(names)}
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    dets: list[dict[str, Any]] = []
    max_dets = 1
    for img_id, (ref, pred) in enumerate(zip(references, predictions, strict=False), start=1):
        images.append({"id": img_id, "width": 1, "height": 1})
        for lab, (x1, y1, x2, y2) in zip(ref.labels, ref.xyxy.tolist(), strict=False):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": img_id,
                    "category_id": cat_id[lab],
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                }
            )
        for lab, (x1, y1, x2, y2), s in zip(
            pred.labels, pred.xyxy.tolist(), pred.scores.tolist(), strict=False
        ):
            dets.append(
                {
                    "image_id": img_id,
                    "category_id": cat_id[lab],
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": s,
                }
            )
        max_dets = max(max_dets, len(pred.labels))
    if not names:
        return {}
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {
            "images": images,
            "annotations": anns,
            "categories": [{"id": i, "name": n} for n, i in cat_id.items()],
        }
        gt.createIndex()
        dt = gt.loadRes(dets) if dets else COCO()
        if not dets:
            dt.dataset = {"images": images, "annotations": [], "categories": gt.dataset["categories"]}
            dt.createIndex()
        ev = COCOeval(gt, dt, "bbox")
        ev.params.iouThrs = np.array([iou_threshold])
        ev.params.maxDets = [max_dets]
        ev.params.areaRng = [[0.0, 1e12]]
        ev.params.areaRngLbl = ["all"]
        if rec_thrs is not None:
            ev.params.recThrs = np.asarray(rec_thrs, dtype=np.float64)
        ev.evaluate()
        ev.accumulate()
    precision = ev.eval["precision"][0, :, :, 0, 0]  # [recall threshold, class]
    out: dict[str, float | None] = {}
    for k, name in enumerate(names):
        col = precision[:, k]
        out[name] = None if np.all(col == -1) else float(np.mean(col))
    return out
