"""bench/grader_enh_det: the enhancement and detection metrics beside their reference libraries.

Measures, each in this process on the same inputs:
- SSIM over 100 slices of 512x512 (LDCT-like, HU): ours (float64) vs skimage's structural_similarity
  with the benchmark's settings, on float32 input (what the public code does) and on float64 input;
  times, and the largest difference from each;
- mAP@0.5 over 1,000 images (3 classes, ~10 boxes each): ours (101-point and VOC all-point) vs
  pycocotools' COCOeval (one IoU threshold, k/100 recall thresholds); times and the difference.

Run: ./just bench grader --only ssim [--slices 100] or --only map [--images 1000] (bench/grader
imports ``bench_ssim`` and ``bench_map`` from here, which add their rows to its figures).
"""

from __future__ import annotations

import numpy as np

from bench import figures
from bench.measure import timed
from scorer.metrics.coco_reference import coco_ap
from scorer.metrics.detection import Boxes, DetParams, mean_average_precision
from scorer.metrics.ssim import reference_data_range, ssim
from tasks.synth.enhancement import ct_slice, low_dose_noise


def bench_ssim(figs: figures.Figures, n_slices: int) -> None:
    from skimage.metrics import structural_similarity

    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(n_slices):
        ref = ct_slice(rng, (512, 512))
        pairs.append((ref.astype(np.float32), (ref + low_dose_noise(rng, ref, 30.0)).astype(np.float32)))
    ranges = [reference_data_range(r) for r, _ in pairs]
    ours, t_ours = timed(lambda: [ssim(r, p, dr) for (r, p), dr in zip(pairs, ranges, strict=False)])

    def skimage(dtype: type) -> list[float]:
        return [
            structural_similarity(
                r.astype(dtype, copy=False),
                p.astype(dtype, copy=False),
                data_range=dr,
                gaussian_weights=True,
                use_sample_covariance=False,
            )
            for (r, p), dr in zip(pairs, ranges, strict=True)
        ]

    sk32, t_sk32 = timed(lambda: skimage(np.float32))
    sk64, t_sk64 = timed(lambda: skimage(np.float64))
    figs.add(
        "ssim",
        f"SSIM on {n_slices} 512×512 slices",
        f"{t_ours:.2f} s",
        f"skimage's `structural_similarity` (float64): {t_sk64:.2f} s; largest difference "
        f"{np.max(np.abs(np.subtract(ours, sk64))):.1e} (on float32 input: {t_sk32:.2f} s, "
        f"{np.max(np.abs(np.subtract(ours, sk32))):.1e})",
    )


def detection_set(n_images: int):
    classes = ("rbc", "wbc", "platelets")
    rng = np.random.default_rng(0)
    refs, preds = [], []
    for _ in range(n_images):
        n = int(rng.integers(2, 18))
        xy = rng.uniform(0, 560, (n, 2))
        g = np.hstack([xy, xy + rng.uniform(10, 80, (n, 2))])
        labels = [classes[k] for k in rng.integers(0, len(classes), n)]
        keep = rng.random(n) < 0.85
        p = g[keep] + rng.normal(0, 5, (int(keep.sum()), 4))
        p[:, 2:] = np.maximum(p[:, 2:], p[:, :2] + 1)
        m = int(rng.integers(0, 5))
        xy = rng.uniform(0, 560, (m, 2))
        p = np.vstack([p, np.hstack([xy, xy + rng.uniform(10, 80, (m, 2))])])
        pl = [lab for lab, k in zip(labels, keep, strict=False) if k] + [
            classes[k] for k in rng.integers(0, len(classes), m)
        ]
        refs.append(Boxes.of(labels, g))
        preds.append(Boxes.of(pl, p, rng.uniform(0, 1, len(pl))))
    return refs, preds


def bench_map(figs: figures.Figures, n_images: int) -> None:
    refs, preds = detection_set(n_images)
    n_boxes = sum(len(r.labels) for r in refs) + sum(len(p.labels) for p in preds)
    p101 = DetParams(interpolation="coco_101", class_set="with_gt", wildcard=None)
    pvoc = DetParams(interpolation="voc_all_point", class_set="with_gt", wildcard=None)
    ours, t_ours = timed(lambda: mean_average_precision(refs, preds, p101))
    voc, t_voc = timed(lambda: mean_average_precision(refs, preds, pvoc))
    theirs, t_coco = timed(lambda: coco_ap(refs, preds, rec_thrs=np.arange(101) / 100))
    coco_map = float(np.mean([v for v in theirs.values() if v is not None]))
    figs.add(
        "map",
        f"mAP@0.5 on {n_images:,} images ({n_boxes:,} boxes), 101-point",
        f"{t_ours:.2f} s (VOC all-point {t_voc:.2f} s)",
        f"pycocotools' COCOeval: {t_coco:.2f} s; difference {abs(ours.map - coco_map):.1e}",
    )
