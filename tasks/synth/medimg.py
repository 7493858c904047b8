"""Small 2-D medical-looking images for the VQA and report twins, drawn to match their text.

Each renderer takes the facts the question or report states (a left pleural effusion, an enlarged
heart, a liver lesion, necrosis in a tissue patch) and draws them, so the twin's image and its text
agree: an agent that really looks at the image could answer. Images are uint8 (grey, or RGB for
H&E pathology), written as baseline JPEG like the real datasets ship them. Pure numpy; every
renderer is a function of its ``rng`` and arguments only.
"""

from __future__ import annotations

import io
import zlib

import numpy as np
from PIL import Image

from schemas.task_spec import TaskSpec


def grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    return (x - (w - 1) / 2) / (w / 2), (y - (h - 1) / 2) / (h / 2)


def ellipse(x, y, cx, cy, ax, ay, angle=0.0) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    u = (x - cx) * c + (y - cy) * s
    v = -(x - cx) * s + (y - cy) * c
    return (u / ax) ** 2 + (v / ay) ** 2 <= 1.0


def case_rng(spec: TaskSpec, seed: int, i: int) -> np.random.Generator:
    """Case ``i``'s own random stream, distinct per task."""
    return np.random.default_rng([seed, zlib.crc32(spec.id.encode()), i])


def _smooth(rng: np.random.Generator, shape: tuple[int, int], cutoff: float) -> np.ndarray:
    """Unit-variance noise with a Gaussian spectrum of width ``cutoff`` (cycles per pixel)."""
    fy = np.fft.fftfreq(shape[0])[:, None]
    fx = np.fft.fftfreq(shape[1])[None, :]
    spec = np.fft.fft2(rng.standard_normal(shape)) * np.exp(-0.5 * (fx * fx + fy * fy) / cutoff**2)
    out = np.fft.ifft2(spec).real
    return out / (out.std() or 1.0)


def _to_u8(img: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)


def chest_xray(
    rng: np.random.Generator, shape: tuple[int, int], findings: dict[str, str], lateral: bool = False
) -> np.ndarray:
    """A frontal (or lateral) chest radiograph: dark lungs, bright mediastinum, ribs, soft tissue.

    ``findings`` keys drawn: ``effusion`` (left/right/bilateral: a meniscus-shaped basal opacity),
    ``cardiomegaly`` (wider heart), ``pneumothorax`` (a lucent apical rim without lung markings),
    ``consolidation`` (a patchy opacity in the named lung), ``edema`` (perihilar haze),
    ``tube`` (a bright line down the trachea), ``nodule`` (a small round opacity).
    """
    h, w = shape
    x, y = grid(h, w)
    img = 0.55 + 0.05 * _smooth(rng, shape, 0.02)
    body = ellipse(x, y, 0, 0.1, 0.95, 1.05)
    img = np.where(body, img + 0.15, 0.05)
    if lateral:
        lung = ellipse(x, y, 0.05, -0.05, 0.55, 0.7)
        img = np.where(lung, img - 0.35, img)
        img += 0.25 * ellipse(x, y, -0.25, 0.25, 0.3, 0.35)  # heart shadow
        img += 0.2 * (np.abs(x - 0.55) < 0.06) * body  # spine
    else:
        for side in (-1, 1):
            lung = ellipse(x, y, side * 0.42, -0.05, 0.33, 0.72)
            img = np.where(lung, img - 0.38 + 0.03 * _smooth(rng, shape, 0.08), img)
        heart_w = 0.42 if "cardiomegaly" in findings else 0.28
        img += 0.35 * ellipse(x, y, 0.08, 0.32, heart_w, 0.3)
        img += 0.3 * (np.abs(x) < 0.1) * (y < 0.1) * body  # mediastinum / spine
        for k in range(7):  # posterior ribs: gentle arcs
            yy = -0.6 + k * 0.2
            arc = np.abs(y - (yy + 0.25 * x * x)) < 0.025
            img += 0.08 * arc * body
        sides = {"left": [1], "right": [-1], "bilateral": [-1, 1]}
        for side in sides.get(findings.get("effusion", ""), []):
            mask = ellipse(x, y, side * 0.42, 0.62, 0.36, 0.22) & (y > 0.45 - 0.2 * np.abs(x - side * 0.42))
            img = np.where(mask, np.maximum(img, 0.72), img)
        for side in sides.get(findings.get("pneumothorax", ""), []):
            rim = ellipse(x, y, side * 0.42, -0.35, 0.3, 0.35) & ~ellipse(x, y, side * 0.4, -0.3, 0.24, 0.3)
            img = np.where(rim, 0.08, img)
        for side in sides.get(findings.get("consolidation", ""), []):
            patch = ellipse(x, y, side * 0.4, 0.2, 0.2, 0.18) & (_smooth(rng, shape, 0.05) > -0.3)
            img = np.where(patch, img + 0.3, img)
        if "edema" in findings:
            img += 0.18 * np.exp(-((x / 0.45) ** 2 + ((y - 0.05) / 0.35) ** 2))
        if "tube" in findings:
            img += 0.4 * ((np.abs(x - 0.01) < 0.012) & (y > -1.0) & (y < -0.2))
        if "nodule" in findings:
            cx = rng.choice([-0.45, 0.45])
            img += 0.3 * ellipse(x, y, cx, -0.3, 0.05, 0.05)
    img += 0.02 * rng.standard_normal(shape)
    return _to_u8(img)


def ct_slice(
    rng: np.random.Generator, shape: tuple[int, int], region: str, lesion: str | None, n_lesions: int = 1
) -> np.ndarray:
    """An axial CT-like slice (window-levelled to grey) of the chest, abdomen or head.

    ``lesion`` names the organ that carries ``n_lesions`` hypodense round lesions (``liver``,
    ``kidney``, ``lung``, ``brain``) or None.
    """
    h, w = shape
    x, y = grid(h, w)
    img = np.zeros(shape)
    if region == "head":
        skull = ellipse(x, y, 0, 0, 0.8, 0.9)
        img = np.where(skull, 0.95, img)
        img = np.where(ellipse(x, y, 0, 0, 0.72, 0.82), 0.45 + 0.03 * _smooth(rng, shape, 0.05), img)
        img = np.where(ellipse(x, y, -0.1, 0, 0.06, 0.2) | ellipse(x, y, 0.1, 0, 0.06, 0.2), 0.2, img)
        organs = {"brain": (0.35, -0.3)}
    else:
        body = ellipse(x, y, 0, 0.05, 0.92, 0.7)
        img = np.where(body, 0.5 + 0.02 * _smooth(rng, shape, 0.1), img)
        img = np.where(body & ~ellipse(x, y, 0, 0.05, 0.86, 0.64), 0.35, img)  # fat rim
        img = np.where(ellipse(x, y, 0, 0.55, 0.1, 0.09), 0.9, img)  # vertebra
        if region == "chest":
            for side in (-1, 1):
                img = np.where(
                    ellipse(x, y, side * 0.45, 0.0, 0.3, 0.45), 0.08 + 0.02 * _smooth(rng, shape, 0.2), img
                )
            img = np.where(ellipse(x, y, 0.05, -0.05, 0.22, 0.2), 0.62, img)  # heart
            organs = {"lung": (0.45, -0.05)}
        else:
            img = np.where(ellipse(x, y, -0.4, -0.05, 0.35, 0.35), 0.62, img)  # liver
            img = np.where(
                ellipse(x, y, 0.3, 0.25, 0.1, 0.14) | ellipse(x, y, -0.3, 0.3, 0.1, 0.14), 0.7, img
            )
            img = np.where(ellipse(x, y, 0.35, -0.25, 0.18, 0.12), 0.15, img)  # bowel gas
            organs = {"liver": (-0.4, -0.05), "kidney": (0.3, 0.25)}
    if lesion in organs:
        cx, cy = organs[lesion]
        for k in range(n_lesions):
            dx = (k - (n_lesions - 1) / 2) * 0.14
            img = np.where(
                ellipse(x, y, cx + dx, cy + 0.04 * k, 0.055, 0.055), 0.3 if lesion != "lung" else 0.6, img
            )
    img += 0.025 * rng.standard_normal(shape)
    return _to_u8(img)


def mri_slice(rng: np.random.Generator, shape: tuple[int, int], lesion: bool) -> np.ndarray:
    """A T2-like axial brain MR slice (bright CSF, grey matter, white matter), optional bright lesion."""
    h, w = shape
    x, y = grid(h, w)
    img = np.zeros(shape)
    head = ellipse(x, y, 0, 0, 0.78, 0.88)
    img = np.where(head, 0.4, img)
    brain = ellipse(x, y, 0, 0, 0.7, 0.8)
    folds = _smooth(rng, shape, 0.06)
    img = np.where(brain, np.where(folds > 0.3, 0.55, 0.35), img)
    img = np.where(ellipse(x, y, -0.12, 0, 0.07, 0.22) | ellipse(x, y, 0.12, 0, 0.07, 0.22), 0.9, img)
    if lesion:
        img = np.where(ellipse(x, y, 0.35, -0.3, 0.1, 0.08), 0.85, img)
    img *= 1 + 0.1 * x  # coil bias field
    img += 0.02 * rng.standard_normal(shape)
    return _to_u8(img)


def he_patch(
    rng: np.random.Generator, shape: tuple[int, int], tissue: str, necrosis: bool = False
) -> np.ndarray:
    """An H&E-stained tissue patch (RGB): pink stroma, purple nuclei, glands or sheets of cells.

    ``tissue``: ``normal`` (regular glands, sparse small nuclei), ``adenocarcinoma`` (crowded,
    irregular glands, large nuclei), ``inflammation`` (dense small dark nuclei), ``fibrosis``
    (streaming pale collagen). ``necrosis`` adds a pale eosinophilic area with nuclear debris.
    """
    h, w = shape
    x, y = grid(h, w)
    stroma = 0.5 + 0.5 * _smooth(rng, shape, 0.03 if tissue != "fibrosis" else 0.01)
    if tissue == "fibrosis":
        stroma = 0.5 + 0.5 * np.sin(8 * x + 3 * _smooth(rng, shape, 0.02))
    r = 0.93 - 0.08 * stroma
    g = 0.70 - 0.18 * stroma
    b = 0.82 - 0.10 * stroma
    counts = {"normal": 40, "adenocarcinoma": 140, "inflammation": 260, "fibrosis": 25}
    radius = {"normal": 0.025, "adenocarcinoma": 0.045, "inflammation": 0.018, "fibrosis": 0.02}
    nuclei = np.zeros(shape, bool)
    for _ in range(counts.get(tissue, 60)):
        cx, cy = rng.uniform(-1, 1, 2)
        rr = radius.get(tissue, 0.03) * rng.uniform(0.7, 1.3)
        nuclei |= ellipse(x, y, cx, cy, rr, rr * rng.uniform(0.6, 1.0))
    if tissue in ("normal", "adenocarcinoma"):
        n_glands = 4 if tissue == "normal" else 9
        for _ in range(n_glands):
            cx, cy = rng.uniform(-0.8, 0.8, 2)
            s = rng.uniform(0.08, 0.18)
            lumen = ellipse(x, y, cx, cy, s, s * rng.uniform(0.5, 1.0))
            r, g, b = np.where(lumen, 0.97, r), np.where(lumen, 0.95, g), np.where(lumen, 0.97, b)
    r, g, b = np.where(nuclei, 0.35, r), np.where(nuclei, 0.2, g), np.where(nuclei, 0.55, b)
    if necrosis:
        area = ellipse(x, y, 0.4, 0.35, 0.35, 0.3)
        debris = rng.random(shape) < 0.05
        r = np.where(area, np.where(debris, 0.5, 0.96), r)
        g = np.where(area, np.where(debris, 0.3, 0.62), g)
        b = np.where(area, np.where(debris, 0.6, 0.7), b)
    rgb = np.stack([r, g, b], axis=-1) + 0.015 * rng.standard_normal((h, w, 3))
    return _to_u8(rgb)


def video_frames(
    rng: np.random.Generator, shape: tuple[int, int], n: int, direction: str
) -> list[np.ndarray]:
    """``n`` ultrasound-like frames (a speckled sector) in which a hypoechoic structure moves
    ``left``, ``right``, ``up`` or ``down`` from frame to frame (or stays for ``none``)."""
    h, w = shape
    x, y = grid(h, w)
    sector = (y > -0.95) & (np.abs(np.arctan2(x, y + 1.0)) < 0.6) & (np.hypot(x, y + 1.0) < 1.9)
    base = 0.45 + 0.15 * _smooth(rng, shape, 0.1)
    step = {"left": (-0.12, 0), "right": (0.12, 0), "up": (0, -0.12), "down": (0, 0.12)}.get(
        direction, (0, 0)
    )
    frames = []
    for k in range(n):
        speckle = rng.rayleigh(0.25, shape)
        cx = step[0] * (k - (n - 1) / 2)
        cy = 0.3 + step[1] * (k - (n - 1) / 2)
        img = base * speckle
        img = np.where(ellipse(x, y, cx, cy, 0.14, 0.1), 0.08 * speckle, img)
        frames.append(_to_u8(np.where(sector, img, 0.0)))
    return frames


def jpeg_bytes(img: np.ndarray, quality: int = 90) -> bytes:
    """A uint8 grey or RGB array as a baseline JPEG (deterministic for one Pillow build)."""
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality, optimize=False)
    return buf.getvalue()
