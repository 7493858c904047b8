"""Synthetic twins of the segmentation tasks: small NIfTI phantoms with organ and lesion labels.

Each case is a smooth, noisy phantom in the task's modality, drawn from its own random stream
(``default_rng([seed, i])``), so case ``i`` is the same whatever the case count. Four recipes:

- ``organ_lesion``: a body cross-section with one or two organs and a lesion inside one of them;
  every third case has no lesion, so the lesion-positive averaging rule is exercised;
- ``fetal_brain``: nested tissue shells of a fetal head in amniotic fluid (FeTA's 7 labels);
- ``airway``: two lungs and a branching airway tree (trachea, main and lobar bronchi);
- ``organ_atlas``: one blob per label id (any ids, e.g. 117 TotalSegmentator classes), each case
  missing a few labels the way a partial field of view would.

CT volumes are int16 Hounsfield units, MRI volumes float32 with a smooth bias field; label maps are
uint8. The affine is the usual scanner-converted one: voxel spacing on the diagonal, x and y flipped
(LPS → RAS), origin so the volume is centred near the scanner's isocentre.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np

from schemas.task_spec import SegSpec, TaskError, TaskSpec
from tasks.synth import copy_references

# Hounsfield units of the tissues a CT phantom uses.
HU = {"air": -1000.0, "fat": -100.0, "soft": 40.0, "lung": -850.0, "bone": 700.0}
# T2-weighted fetal MRI signal by FeTA tissue name (CSF bright, GM darker than the immature WM).
FETAL_T2 = {"eCSF": 1000.0, "GM": 420.0, "WM": 620.0, "LV": 980.0, "CBM": 480.0, "SGM": 450.0, "BS": 500.0}


class Phantom:
    """Voxel grid in millimetres, centred on the volume's middle."""

    def __init__(self, shape: tuple[int, int, int], spacing: tuple[float, float, float]) -> None:
        self.shape = shape
        self.spacing = spacing
        axes = [(np.arange(n) - (n - 1) / 2.0) * s for n, s in zip(shape, spacing, strict=False)]
        self.x, self.y, self.z = np.meshgrid(*axes, indexing="ij", sparse=True)
        self.extent = np.array([n * s for n, s in zip(shape, spacing, strict=False)]) / 2.0  # half-size in mm

    def ellipsoid(
        self, center, radii, rng: np.random.Generator | None = None, wobble: float = 0.0
    ) -> np.ndarray:
        """A boolean ellipsoid; ``wobble`` adds a low-frequency bumpy surface (organs are not ellipses)."""
        cx, cy, cz = center
        rx, ry, rz = (max(r, 1e-3) for r in radii)
        d = ((self.x - cx) / rx) ** 2 + ((self.y - cy) / ry) ** 2 + ((self.z - cz) / rz) ** 2
        if wobble and rng is not None:
            fx, fy, fz = rng.uniform(0.5, 1.5, 3) * 2 * np.pi / np.maximum(self.extent, 1.0)
            px, py, pz = rng.uniform(0, 2 * np.pi, 3)
            d = d * (
                1.0 + wobble * np.sin(fx * self.x + px) * np.sin(fy * self.y + py) * np.cos(fz * self.z + pz)
            )
        return d <= 1.0

    def tube(self, a, b, radius: float) -> np.ndarray:
        """A boolean cylinder of ``radius`` mm between points ``a`` and ``b``."""
        a, b = np.asarray(a, float), np.asarray(b, float)
        ab = b - a
        length2 = float(ab @ ab) or 1e-9
        t = ((self.x - a[0]) * ab[0] + (self.y - a[1]) * ab[1] + (self.z - a[2]) * ab[2]) / length2
        t = np.clip(t, 0.0, 1.0)
        dx, dy, dz = self.x - (a[0] + t * ab[0]), self.y - (a[1] + t * ab[1]), self.z - (a[2] + t * ab[2])
        return dx * dx + dy * dy + dz * dz <= radius * radius

    def affine(self) -> np.ndarray:
        sx, sy, sz = self.spacing
        aff = np.diag([-sx, -sy, sz, 1.0])
        aff[:3, 3] = [self.extent[0], self.extent[1], -self.extent[2]]
        return aff


def _jitter(rng: np.random.Generator, scale: float, n: int = 3) -> np.ndarray:
    return rng.uniform(-scale, scale, n)


# --- recipes: each returns (tissue intensity map before noise, {target name or label id: mask}) -----


def _body(ph: Phantom, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """An abdominal/thoracic cross-section: fat ring, soft tissue, a vertebral body behind."""
    ex, ey, _ = ph.extent
    rx, ry = 0.9 * ex * rng.uniform(0.92, 1.0), 0.72 * ey * rng.uniform(0.92, 1.0)
    body = ph.ellipsoid((0, 0, 0), (rx, ry, 1e6))
    inner = ph.ellipsoid((0, 0, 0), (rx - 0.08 * ex, ry - 0.08 * ey, 1e6))
    img = np.full(ph.shape, HU["air"])
    img[body] = HU["fat"]
    img[inner] = HU["soft"]
    spine = ph.ellipsoid((0, -0.5 * ry, 0), (0.12 * ex, 0.12 * ey, 1e6))
    img[spine] = HU["bone"]
    return img, inner


def organ_lesion(ph: Phantom, seg: SegSpec, rng: np.random.Generator, i: int, ct: bool):
    img, inner = _body(ph, rng)
    ex, ey, ez = ph.extent
    organ = np.zeros(ph.shape, bool)
    bodies = []
    for k in range(seg.synth_organs):
        side = (-1) ** k if seg.synth_organs > 1 else 0
        c = (
            side * 0.45 * ex + _jitter(rng, 0.05 * ex, 1)[0],
            -0.1 * ey + _jitter(rng, 0.05 * ey, 1)[0],
            _jitter(rng, 0.1 * ez, 1)[0],
        )
        r = (
            0.22 * ex * rng.uniform(0.85, 1.15),
            0.28 * ey * rng.uniform(0.85, 1.15),
            0.55 * ez * rng.uniform(0.8, 1.0),
        )
        if seg.synth_organs == 1:  # a single elongated organ (pancreas-like) across the midline
            r = (0.5 * ex * rng.uniform(0.85, 1.1), 0.14 * ey * rng.uniform(0.85, 1.15), 0.45 * ez)
        bodies.append((c, r))
        organ |= ph.ellipsoid(c, r, rng, wobble=0.15) & inner
    img[organ] = 150.0 if ct else 0.0  # contrast-enhanced parenchyma
    lesion = np.zeros(ph.shape, bool)
    if i % 3 != 2:  # every third case is lesion-free
        c, r = bodies[int(rng.integers(len(bodies)))]
        lc = np.asarray(c) + _jitter(rng, 0.3, 3) * np.asarray(r)
        lr = np.asarray(r) * rng.uniform(0.25, 0.45)
        lesion = ph.ellipsoid(lc, lr, rng, wobble=0.2) & organ
        if not lesion.any():  # tiny organ: put the lesion at its centre
            lesion = ph.ellipsoid(c, np.asarray(r) * 0.3) & organ
        img[lesion] = 60.0 if ct else 0.0
    masks = {t.name: (lesion if t.kind == "lesion" else organ | lesion) for t in seg.targets}
    tissue = {"organ": organ, "lesion": lesion}
    return img, masks, tissue


def fetal_brain(ph: Phantom, seg: SegSpec, rng: np.random.Generator):
    ex, ey, ez = ph.extent
    img = np.full(ph.shape, 300.0)  # maternal tissue
    img[ph.ellipsoid((0, 0, 0), 0.95 * ph.extent)] = 900.0  # amniotic fluid
    R = np.array([0.78 * ex, 0.70 * ey, 0.62 * ez]) * rng.uniform(0.9, 1.0)
    c0 = _jitter(rng, 0.04 * min(ex, ey, ez))
    head = ph.ellipsoid(c0, R)
    cortex = ph.ellipsoid(c0, R * 0.9, rng, wobble=0.05)  # folded cortical surface
    white = ph.ellipsoid(c0, R * 0.8)
    masks = {"eCSF": head & ~cortex, "GM": cortex & ~white, "WM": white}
    deep = {
        "LV": [
            ph.ellipsoid(c0 + (s * 0.12 * R[0], 0.05 * R[1], 0.1 * R[2]), R * (0.07, 0.3, 0.12))
            for s in (-1, 1)
        ],
        "SGM": [ph.ellipsoid(c0 + (s * 0.3 * R[0], 0.0, -0.05 * R[2]), R * 0.13) for s in (-1, 1)],
        "CBM": [ph.ellipsoid(c0 + (0, -0.55 * R[1], -0.5 * R[2]), R * (0.35, 0.2, 0.18))],
        "BS": [
            ph.tube(c0 + (0, -0.2 * R[1], -0.2 * R[2]), c0 + (0, -0.25 * R[1], -0.95 * R[2]), 0.09 * R[0])
        ],
    }
    for name, pieces in deep.items():  # deep structures carve their space out of the shells
        m = np.logical_or.reduce(pieces) & head
        for other in masks:
            masks[other] &= ~m
        masks[name] = m
    for name, m in masks.items():
        img[m] = FETAL_T2.get(name, 600.0)
    return img, masks


def airway(ph: Phantom, rng: np.random.Generator):
    img, inner = _body(ph, rng)
    ex, ey, ez = ph.extent
    lungs = np.zeros(ph.shape, bool)
    for s in (-1, 1):
        c = (s * 0.42 * ex, 0.05 * ey, 0.0) + _jitter(rng, 0.03 * ex)
        lungs |= ph.ellipsoid(c, (0.36 * ex, 0.55 * ey, 0.85 * ez), rng, wobble=0.08) & inner
    img[lungs] = HU["lung"]
    top = (0.0, 0.15 * ey, 1.05 * ez)
    carina = (0.0, 0.1 * ey, 0.25 * ez) + _jitter(rng, 0.03 * ez)
    r0 = max(1.6 * max(ph.spacing[:2]), 0.08 * ex)
    tree = ph.tube(top, carina, r0)
    for s in (-1, 1):  # main bronchi, then two lobar branches each
        end = np.asarray(carina) + (s * 0.35 * ex, 0.0, -0.3 * ez) + _jitter(rng, 0.03 * ex)
        tree |= ph.tube(carina, end, 0.7 * r0)
        for up in (-1, 1):
            tip = end + (s * 0.15 * ex, up * 0.15 * ey, up * 0.25 * ez) + _jitter(rng, 0.02 * ex)
            tree |= ph.tube(end, tip, 0.5 * r0)
    img[tree] = HU["air"]
    return img, {"lung": lungs & ~tree, "airway": tree}


def organ_atlas(ph: Phantom, seg: SegSpec, rng: np.random.Generator):
    img, inner = _body(ph, rng)
    ids = [lab.id for lab in seg.labels]
    n = len(ids)
    per_axis = int(np.ceil(n ** (1 / 3)))
    cell = 1.4 * ph.extent / per_axis  # cells tile the body's inner part
    label_map = np.zeros(ph.shape, np.int32)
    dropped = set(rng.choice(ids, size=max(0, n // 10), replace=False).tolist()) if n > 3 else set()
    for k, lab in enumerate(ids):
        if lab in dropped:
            continue
        gx, gy, gz = np.unravel_index(k, (per_axis,) * 3)
        c = (np.array([gx, gy, gz]) + 0.5) * cell - 0.7 * ph.extent + _jitter(rng, 0.15) * cell
        r = cell * rng.uniform(0.35, 0.55, 3)
        m = ph.ellipsoid(c, r, rng, wobble=0.1)
        if not m.any():  # a cell finer than the grid: one voxel at its centre
            m = ph.ellipsoid(c, np.maximum(r, np.asarray(ph.spacing)))
        label_map[m] = lab
        img[m] = rng.uniform(-50, 250)
    return img, label_map


# --- writing -----------------------------------------------------------------------------------------


def _blur(img: np.ndarray) -> np.ndarray:
    """A separable [1, 2, 1]/4 smoothing on every axis (edges replicated): partial-volume softness."""
    for axis in range(img.ndim):
        padded = np.concatenate([img.take([0], axis), img, img.take([-1], axis)], axis=axis)
        n = img.shape[axis]
        img = 0.25 * padded.take(range(0, n), axis) + 0.5 * img + 0.25 * padded.take(range(2, n + 2), axis)
    return img.astype(np.float32)


def _noisy(img: np.ndarray, ph: Phantom, rng: np.random.Generator, ct: bool) -> np.ndarray:
    """Partial-volume blur, then the modality's noise: Gaussian HU noise for CT; for MRI a smooth
    multiplicative bias field and Rician-like magnitude noise."""
    img = _blur(img.astype(np.float32))
    if ct:
        img = img + rng.normal(0.0, 12.0, img.shape).astype(np.float32)
        return np.clip(np.rint(img), -1024, 3071).astype(np.int16)
    bias = 1.0 + 0.15 * np.cos(ph.x / ph.extent[0] * rng.uniform(0.5, 1.5)) * np.cos(ph.y / ph.extent[1])
    img = img * bias.astype(np.float32)
    sigma = 0.03 * float(img.max() or 1.0)
    noisy = np.hypot(img + rng.normal(0, sigma, img.shape), rng.normal(0, sigma, img.shape))
    return noisy.astype(np.float32)


def _save(data: np.ndarray, affine: np.ndarray, path: Path) -> None:
    img = nib.Nifti1Image(data, affine)
    img.header.set_xyzt_units("mm", "sec")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, str(path))


def make_case(spec: TaskSpec, i: int, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """One case: the image, the reference volumes by private file name, and the affine."""
    seg = spec.seg
    assert seg is not None
    rng = np.random.default_rng([seed, i])
    # Why the ignore[arg-type] below: the spec validates three numbers each (lists in TOML, tuples here).
    ph = Phantom(tuple(seg.synth_shape), tuple(seg.synth_spacing))  # type: ignore[arg-type]
    ct = spec.modality.upper().startswith("CT")
    refs: dict[str, np.ndarray] = {}
    if seg.synth_recipe == "organ_lesion":
        img, masks, tissue = organ_lesion(ph, seg, rng, i, ct)
        if not ct:  # MRI: organ darker (T1) or brighter (T2) than the background tissue
            img = np.where(img <= HU["air"] + 1, 0.0, 350.0)
            img[tissue["organ"]] = 520.0
            img[tissue["lesion"]] = 260.0
        for t in seg.targets:
            refs[t.file] = masks[t.name].astype(np.uint8)
    elif seg.synth_recipe == "fetal_brain":
        img, masks = fetal_brain(ph, seg, rng)
        refs[seg.label_file] = _label_map(ph, seg, masks)
    elif seg.synth_recipe == "airway":
        img, masks = airway(ph, rng)
        refs[seg.label_file] = _label_map(ph, seg, masks)
    else:
        img, label_map = organ_atlas(ph, seg, rng)
        refs[seg.label_file] = label_map.astype(
            np.uint8 if max(lab.id for lab in seg.labels) < 256 else np.uint16
        )
    return _noisy(img, ph, rng, ct), refs, ph.affine()


def _label_map(ph: Phantom, seg: SegSpec, masks: dict[str, np.ndarray]) -> np.ndarray:
    out = np.zeros(ph.shape, np.uint8)
    for lab in seg.labels:
        if lab.name not in masks:
            raise TaskError(f"synthetic recipe {seg.synth_recipe!r} has no structure named {lab.name!r}")
        out[masks[lab.name]] = lab.id
    return out


def synth(spec: TaskSpec, out: Path, cases: int, seed: int) -> None:
    seg = spec.seg
    if seg is None:
        raise TaskError(f"task {spec.id}: no [seg] table")
    public_name = seg.input_file or spec.public.files[0]
    for i in range(cases):
        case = spec.case_id(i)
        img, refs, affine = make_case(spec, i, seed)
        _save(img, affine, out / "public" / spec.public.case_dir.format(case=case) / public_name)
        for name, data in refs.items():
            _save(data, affine, out / "private" / spec.private.case_dir.format(case=case) / name)


def perfect_submission(spec: TaskSpec, data: Path, workspace: Path) -> None:
    """Copy every reference volume to where the agent must write it."""
    copy_references(spec, data, workspace, "*")
