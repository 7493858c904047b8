"""Synthetic twins for the detection track: PNG images with class-labelled boxes.

Each style draws what its modality looks like at a glance and puts every reference box tightly
around an object of its class:

- ``smear`` (BCCD): pink background, red cells with central pallor, purple lobed white cells,
  small platelets; classes RBC / WBC / Platelets.
- ``chest_xray`` (VinDr-CXR): dark lungs, bright mediastinum, spine, ribs; nodules and
  consolidations inside the lungs; class ``abnormality``.
- ``wrist_xray`` (GRAZPEDWRI-DX): radius, ulna and carpal bones in soft tissue; a fracture line,
  metal, a side marker, periosteal reaction, soft-tissue swelling, ...; the dataset's 9 classes.
- ``dental_xray`` (DENTEX): a panoramic arc of teeth; caries, deep caries, periapical lesions and
  impacted teeth.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from schemas.task_spec import TaskError, TaskSpec
from tasks.synth import case_dirs, reference_cases

Box = tuple[str, float, float, float, float]


class Canvas:
    """A float image in [0, 1] (grey or RGB) with disc/ellipse painting that returns tight boxes."""

    def __init__(self, h: int, w: int, channels: int, fill):
        self.h, self.w = h, w
        self.img = np.empty((h, w, channels))
        self.img[:] = fill
        self.y, self.x = np.mgrid[0:h, 0:w].astype(np.float64)

    def ellipse(self, cx, cy, ax, ay, color, angle=0.0, alpha=1.0) -> np.ndarray:
        c, s = np.cos(angle), np.sin(angle)
        u = ((self.x - cx) * c + (self.y - cy) * s) / ax
        v = (-(self.x - cx) * s + (self.y - cy) * c) / ay
        m = u * u + v * v <= 1.0
        self.img[m] = (1 - alpha) * self.img[m] + alpha * np.asarray(color, dtype=np.float64)
        return m

    def keep_box(self, boxes: list[Box], cls: str, mask: np.ndarray) -> None:
        """Append the tight box of ``mask`` unless its object fell (almost) outside the image."""
        ys, xs = np.nonzero(mask)
        if len(xs) >= 4:
            boxes.append((cls, float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)))

    def finish(self, rng, noise: float, blur_passes: int = 1) -> np.ndarray:
        img: np.ndarray = self.img
        for _ in range(blur_passes):  # a cheap 3x3 box blur: optics, not pixel art
            p = np.pad(img, ((1, 1), (1, 1), (0, 0)), mode="edge")
            img = (
                np.asarray(sum(p[dy : dy + self.h, dx : dx + self.w] for dy in range(3) for dx in range(3)))
                / 9.0
            )
        img = img + noise * rng.standard_normal(img.shape)
        out = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
        return out[..., 0] if out.shape[2] == 1 else out


def _smear(rng, h, w, n) -> tuple[np.ndarray, list[Box]]:
    cv = Canvas(h, w, 3, (0.93, 0.84, 0.86))
    boxes: list[Box] = []
    r = min(h, w) / 11
    n_wbc = 1 if rng.random() < 0.9 else 2
    n_plt = int(rng.integers(0, 3))
    for _ in range(max(1, n - n_wbc - n_plt)):
        cx, cy, rr = rng.uniform(0, w), rng.uniform(0, h), r * rng.uniform(0.85, 1.15)
        m = cv.ellipse(cx, cy, rr, rr * rng.uniform(0.85, 1.0), (0.86, 0.55, 0.56), rng.uniform(0, 3))
        cv.ellipse(cx, cy, rr * 0.45, rr * 0.45, (0.9, 0.7, 0.72), alpha=0.6)  # central pallor
        cv.keep_box(boxes, "RBC", m)
    for _ in range(n_wbc):
        cx, cy, rr = rng.uniform(r, w - r), rng.uniform(r, h - r), r * 1.35
        m = cv.ellipse(cx, cy, rr, rr, (0.82, 0.75, 0.88))
        for _ in range(3):  # lobed nucleus
            ox, oy = rng.uniform(-0.4, 0.4) * rr, rng.uniform(-0.4, 0.4) * rr
            cv.ellipse(cx + ox, cy + oy, rr * 0.4, rr * 0.3, (0.42, 0.22, 0.55), rng.uniform(0, 3))
        cv.keep_box(boxes, "WBC", m)
    for _ in range(n_plt):
        cx, cy = rng.uniform(5, w - 5), rng.uniform(5, h - 5)
        cv.keep_box(boxes, "Platelets", cv.ellipse(cx, cy, r * 0.25, r * 0.2, (0.55, 0.35, 0.62)))
    return cv.finish(rng, 0.02), boxes


def _chest(rng, h, w, n) -> tuple[np.ndarray, list[Box]]:
    cv = Canvas(h, w, 1, 0.08)
    cv.ellipse(w / 2, h * 0.55, w * 0.47, h * 0.5, 0.55)  # thorax soft tissue
    lungs = [cv.ellipse(w / 2 + s * w * 0.2, h * 0.5, w * 0.16, h * 0.33, 0.18, s * 0.08) for s in (-1, 1)]
    for k in range(7):  # ribs
        for s in (-1, 1):
            cv.ellipse(
                w / 2 + s * w * 0.2, h * (0.25 + 0.08 * k), w * 0.2, h * 0.012, 0.42, s * 0.25, alpha=0.5
            )
    cv.ellipse(w / 2 + w * 0.04, h * 0.62, w * 0.13, h * 0.14, 0.6)  # heart
    cv.ellipse(w / 2, h * 0.5, w * 0.035, h * 0.45, 0.7)  # spine
    boxes: list[Box] = []
    for _ in range(n):
        lung = lungs[int(rng.integers(0, 2))]
        ys, xs = np.nonzero(lung)
        j = int(rng.integers(0, len(xs)))
        big = rng.random() < 0.4
        ax = w * (rng.uniform(0.05, 0.09) if big else rng.uniform(0.015, 0.03))
        m = cv.ellipse(xs[j], ys[j], ax, ax * rng.uniform(0.7, 1.3), 0.5, rng.uniform(0, 3), alpha=0.7)
        cv.keep_box(boxes, "abnormality", m)
    return cv.finish(rng, 0.025), boxes


def _wrist(rng, h, w, n, classes) -> tuple[np.ndarray, list[Box]]:
    cv = Canvas(h, w, 1, 0.05)
    cv.ellipse(w / 2, h * 0.7, w * 0.38, h * 0.6, 0.28)  # forearm soft tissue
    radius = cv.ellipse(w * 0.36, h * 0.7, w * 0.09, h * 0.42, 0.75, 0.04)
    cv.ellipse(w * 0.64, h * 0.72, w * 0.07, h * 0.4, 0.72, -0.04)  # ulna
    for k in range(6):  # carpals
        cv.ellipse(w * (0.3 + 0.08 * k), h * (0.22 + 0.03 * (k % 2)), w * 0.05, h * 0.035, 0.7)
    boxes: list[Box] = []
    for _ in range(n):
        cls = classes[int(rng.integers(0, len(classes)))]
        cx, cy = rng.uniform(w * 0.25, w * 0.75), rng.uniform(h * 0.2, h * 0.9)
        if cls == "fracture":
            ys, xs = np.nonzero(radius)
            j = int(rng.integers(0, len(xs)))
            m = cv.ellipse(xs[j], ys[j], w * 0.11, h * 0.008, 0.15, rng.uniform(-0.4, 0.4))
        elif cls in ("metal", "foreignbody"):
            m = cv.ellipse(cx, cy, w * 0.03, h * 0.05, 1.0 if cls == "metal" else 0.9, rng.uniform(0, 3))
        elif cls == "text":
            cx, cy = rng.uniform(w * 0.05, w * 0.2), rng.uniform(h * 0.03, h * 0.12)
            m = cv.ellipse(cx, cy, w * 0.04, h * 0.025, 0.95) | cv.ellipse(cx, cy, w * 0.01, h * 0.025, 0.05)
        elif cls == "softtissue":
            m = cv.ellipse(cx, cy, w * 0.12, h * 0.08, 0.38, alpha=0.6)
        elif cls == "periostealreaction":
            m = cv.ellipse(cx, cy, w * 0.015, h * 0.08, 0.85)
        else:  # boneanomaly, bonelesion, pronatorsign: a lucent or sclerotic focus
            m = cv.ellipse(cx, cy, w * 0.04, h * 0.03, 0.45 if rng.random() < 0.5 else 0.9, alpha=0.8)
        cv.keep_box(boxes, cls, m)
    return cv.finish(rng, 0.02), boxes


def _dental(rng, h, w, n, classes) -> tuple[np.ndarray, list[Box]]:
    cv = Canvas(h, w, 1, 0.1)
    cv.ellipse(w / 2, h * 0.5, w * 0.46, h * 0.42, 0.3)  # jaws
    teeth = []
    for jaw, cy, tilt in ((0, h * 0.36, -1), (1, h * 0.64, 1)):
        for k in range(14):
            t = (k + 0.5) / 14
            cx = w * (0.12 + 0.76 * t)
            cyk = cy + tilt * h * 0.08 * (2 * t - 1) ** 2
            teeth.append((cx, cyk, jaw, cv.ellipse(cx, cyk, w * 0.022, h * 0.12, 0.82)))
            cv.ellipse(cx, cyk, w * 0.006, h * 0.08, 0.55)  # pulp canal
    boxes: list[Box] = []
    for idx in rng.permutation(len(teeth))[:n]:
        cx, cy, jaw, tooth = teeth[int(idx)]
        cls = classes[int(rng.integers(0, len(classes)))]
        crown = cy + (1 if jaw == 0 else -1) * h * 0.08
        apex = cy - (1 if jaw == 0 else -1) * h * 0.13
        if cls == "Caries":
            m = cv.ellipse(cx, crown, w * 0.01, h * 0.025, 0.35)
        elif cls == "Deep Caries":
            m = cv.ellipse(cx, crown - (1 if jaw == 0 else -1) * h * 0.02, w * 0.015, h * 0.05, 0.3)
        elif cls == "Periapical Lesion":
            m = cv.ellipse(cx, apex, w * 0.02, h * 0.04, 0.18)
        else:  # Impacted: a tilted tooth under the arc
            m = tooth | cv.ellipse(cx, cy + (-1 if jaw == 0 else 1) * h * 0.1, w * 0.02, h * 0.09, 0.85, 1.2)
        cv.keep_box(boxes, cls, m)
    return cv.finish(rng, 0.02), boxes


def make_case(spec: TaskSpec, seed: int, i: int) -> tuple[np.ndarray, list[Box]]:
    det = spec.det
    rng = np.random.default_rng([seed, i, 21])
    assert det is not None
    h, w = int(det.synth_shape[0]), int(det.synth_shape[1])
    n = int(rng.integers(det.synth_boxes[0], det.synth_boxes[1] + 1))
    classes = list(spec.submission.classes)
    if det.style == "smear":
        return _smear(rng, h, w, n)
    if det.style == "chest_xray":
        return _chest(rng, h, w, n)
    if det.style == "wrist_xray":
        return _wrist(rng, h, w, n, classes)
    return _dental(rng, h, w, n, classes)


def synth(spec: TaskSpec, out: Path, cases: int, seed: int) -> None:
    if spec.det is None:
        raise TaskError(f"task {spec.id}: no [det] table")
    for i in range(cases):
        case = spec.case_id(i)
        img, boxes = make_case(spec, seed, i)
        pub, priv = case_dirs(spec, out, case)
        Image.fromarray(img).save(pub / spec.det.image_file)
        h, w = img.shape[:2]
        rows = [{"class": c, "x1": x1, "y1": y1, "x2": x2, "y2": y2} for c, x1, y1, x2, y2 in boxes]
        doc = {"width": w, "height": h, "boxes": rows}
        (priv / spec.det.reference_file).write_text(json.dumps(doc, indent=1))


def perfect_submission(spec: TaskSpec, data: Path, workspace: Path) -> None:
    assert spec.det is not None
    for case in reference_cases(data / "private", spec.det.reference_file):
        ref = json.loads((data / "private" / case / spec.det.reference_file).read_text())
        dest = workspace / spec.submission.root / case / spec.det.output_file
        dest.parent.mkdir(parents=True, exist_ok=True)
        boxes = [
            {"class": b["class"], "score": 1.0, **{k: b[k] for k in ("x1", "y1", "x2", "y2")}}
            for b in ref["boxes"]
        ]
        dest.write_text(json.dumps({"boxes": boxes}))
