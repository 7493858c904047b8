"""Synthetic twins for the enhancement track: 2-D float32 slices in ``.npy``.

- LDCT denoising: a clean CT slice in HU (air, fat, soft tissue, organs with contrast, lungs with
  vessels, vertebra) and a low-dose input made by adding noise with CT's noise texture: white noise
  shaped by a ramp-times-Gaussian power spectrum (the filtered back-projection's noise power spectrum
  peaks at mid frequencies, so the noise is "grainy", not white) and stronger inside the body than in
  air, as photon starvation makes it.
- MRI super-resolution: a [0, 1] brain-like slice (scalp, skull, cortex with folded grey/white
  boundary, ventricles, a smooth bias field, Rician noise) and its ×2 low-resolution input, made as
  an MR scanner would: keep the central quarter of k-space and transform back (with its Gibbs ringing).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from schemas.task_spec import TaskError, TaskSpec
from tasks.synth import case_dirs, copy_references
from tasks.synth.medimg import ellipse, grid


def _smooth_noise(rng: np.random.Generator, shape, cutoff: float) -> np.ndarray:
    """Unit-variance noise with a Gaussian spectrum of width ``cutoff`` (cycles per pixel)."""
    f = _spectrum_radius(shape)
    spec = np.fft.fft2(rng.standard_normal(shape)) * np.exp(-0.5 * (f / cutoff) ** 2)
    out = np.fft.ifft2(spec).real
    return out / (out.std() or 1.0)


def _spectrum_radius(shape) -> np.ndarray:
    fy = np.fft.fftfreq(shape[0])[:, None]
    fx = np.fft.fftfreq(shape[1])[None, :]
    return np.sqrt(fx * fx + fy * fy)


def _blur(img: np.ndarray, sigma_px: float) -> np.ndarray:
    f = _spectrum_radius(img.shape)
    return np.fft.ifft2(np.fft.fft2(img) * np.exp(-2 * (np.pi * sigma_px * f) ** 2)).real


def ct_slice(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """A clean axial CT slice in HU: chest (lungs, heart, aorta) or abdomen (liver, kidneys, gas)."""
    h, w = shape
    x, y = grid(h, w)
    img = np.full(shape, -1000.0)
    ax, ay = 0.86 + 0.06 * rng.uniform(-1, 1), 0.66 + 0.06 * rng.uniform(-1, 1)
    body = ellipse(x, y, 0, 0.05, ax, ay)
    img[body] = -100.0  # subcutaneous fat
    img[ellipse(x, y, 0, 0.05, ax - 0.07, ay - 0.07)] = 40.0  # muscle and soft tissue
    if rng.random() < 0.5:  # chest
        for side in (-1, 1):
            lung = ellipse(x, y, side * 0.38, -0.02, 0.28 + 0.03 * rng.random(), 0.42, side * 0.15)
            img[lung] = -860.0
            for _ in range(int(rng.integers(6, 14))):  # vessels
                cx, cy = side * 0.38 + rng.uniform(-0.2, 0.2), rng.uniform(-0.3, 0.3)
                img[lung & ellipse(x, y, cx, cy, 0.015 + 0.02 * rng.random(), 0.02)] = -80.0
        img[ellipse(x, y, 0.06, 0.12, 0.24, 0.21, 0.3)] = 45.0  # heart
        img[ellipse(x, y, 0.08, 0.34, 0.06, 0.06)] = 220.0  # contrast-filled aorta
    else:  # abdomen
        img[ellipse(x, y, -0.33, -0.08, 0.36, 0.30, -0.2)] = 62.0  # liver
        if rng.random() < 0.7:
            img[ellipse(x, y, -0.38 + 0.1 * rng.random(), -0.1, 0.06, 0.05)] = 18.0  # hypodense lesion
        img[ellipse(x, y, 0.48, -0.05, 0.14, 0.12)] = 52.0  # spleen
        for side in (-1, 1):
            img[ellipse(x, y, side * 0.3, 0.28, 0.09, 0.13, side * 0.4)] = 160.0  # enhancing kidneys
        for _ in range(int(rng.integers(2, 6))):  # bowel gas
            cx, cy = rng.uniform(-0.2, 0.35), rng.uniform(-0.35, 0.1)
            img[ellipse(x, y, cx, cy, 0.03 + 0.04 * rng.random(), 0.03)] = -920.0
        img[ellipse(x, y, 0.05, 0.33, 0.05, 0.05)] = 190.0  # aorta
    vert = ellipse(x, y, 0, 0.52, 0.11, 0.09)
    img[vert] = 900.0  # cortical bone
    img[ellipse(x, y, 0, 0.52, 0.08, 0.065)] = 260.0  # cancellous bone
    img += body * 8.0 * _smooth_noise(rng, shape, 0.05)  # tissue texture
    img = _blur(img, 0.6)
    return np.clip(img, -1024.0, 3071.0)


def low_dose_noise(rng: np.random.Generator, clean_hu: np.ndarray, sigma_hu: float) -> np.ndarray:
    """CT-textured noise: ramp × Gaussian noise power spectrum, stronger in attenuating tissue."""
    f = _spectrum_radius(clean_hu.shape)
    shaped = np.fft.ifft2(
        np.fft.fft2(rng.standard_normal(clean_hu.shape)) * f * np.exp(-((f / 0.3) ** 2))
    ).real
    shaped /= shaped.std() or 1.0
    attenuating = _blur((clean_hu > -500).astype(np.float64), 2.0)
    return sigma_hu * (0.35 + 0.9 * attenuating) * shaped


def mri_slice(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """A T1-like brain slice in [0, 1] with fine cortical folding (what super-resolution must restore)."""
    h, w = shape
    x, y = grid(h, w)
    r = np.hypot(x / 0.82, y / 0.9)
    theta = np.arctan2(y, x)
    fold = sum(
        rng.uniform(0.005, 0.02) * np.sin(k * theta + rng.uniform(0, 2 * np.pi)) for k in (11, 17, 23, 31)
    )
    img = np.zeros(shape)
    img[r < 1.0] = 0.85  # scalp fat
    img[r < 0.93] = 0.06  # skull
    img[r < 0.88] = 0.18  # CSF
    img[r < 0.85 + fold] = 0.48  # grey matter
    img[r < 0.72 + 1.6 * fold] = 0.7  # white matter
    for side in (-1, 1):  # lateral ventricles
        img[ellipse(x, y, side * 0.1, -0.05, 0.06, 0.22, side * 0.25)] = 0.16
    img[ellipse(x, y, 0, 0.25, 0.08, 0.06)] = 0.42  # deep grey nuclei
    img *= 1.0 + 0.12 * _smooth_noise(rng, shape, 0.01)  # coil bias field
    sigma = 0.012
    img = np.hypot(img + sigma * rng.standard_normal(shape), sigma * rng.standard_normal(shape))  # Rician
    img = _blur(img, 0.5)
    return np.clip(img / max(float(img.max()), 1e-6), 0.0, 1.0)


def kspace_downsample(hr: np.ndarray, factor: int) -> np.ndarray:
    """Keep the central 1/factor of k-space per axis and transform back (an MR low-res acquisition)."""
    h, w = hr.shape
    if h % factor or w % factor:
        raise TaskError(f"synth_shape {hr.shape} is not divisible by the scale {factor}")
    k = np.fft.fftshift(np.fft.fft2(hr))
    lh, lw = h // factor, w // factor
    top, left = (h - lh) // 2, (w - lw) // 2
    low = np.fft.ifft2(np.fft.ifftshift(k[top : top + lh, left : left + lw])).real / (factor * factor)
    return np.clip(low, 0.0, 1.0)


def make_case(spec: TaskSpec, seed: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(input, reference) of case ``i``, both float32."""
    enh = spec.enh
    rng = np.random.default_rng([seed, i, 5])
    assert enh is not None
    shape = (int(enh.synth_shape[0]), int(enh.synth_shape[1]))
    if enh.kind == "denoise":
        clean = ct_slice(rng, shape)
        noisy = clean + low_dose_noise(rng, clean, float(rng.uniform(22.0, 38.0)))
        return noisy.astype(np.float32), clean.astype(np.float32)
    hr = mri_slice(rng, shape)
    return kspace_downsample(hr, enh.scale).astype(np.float32), hr.astype(np.float32)


def write_ranges(path: Path, ranges: dict[str, float]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["patient_id", "data_range"])
        for case, dr in ranges.items():
            out.writerow([case, repr(float(dr))])


def write_case(spec: TaskSpec, out: Path, case: str, inp: np.ndarray, ref: np.ndarray) -> float:
    """One case's input under ``public/`` and reference under ``private/``; returns its data range."""
    assert spec.enh is not None
    pub, priv = case_dirs(spec, out, case)
    np.save(pub / spec.enh.input_file, inp)
    np.save(priv / spec.enh.reference_file, ref)
    return float(ref.max()) - float(ref.min())


def synth(spec: TaskSpec, out: Path, cases: int, seed: int) -> None:
    if spec.enh is None:
        raise TaskError(f"task {spec.id}: no [enh] table")
    ranges: dict[str, float] = {}
    for i in range(cases):
        case = spec.case_id(i)
        inp, ref = make_case(spec, seed, i)
        ranges[case] = write_case(spec, out, case, inp, ref)
    write_ranges(out / "private" / spec.enh.ranges_file, ranges)


def perfect_submission(spec: TaskSpec, data: Path, workspace: Path) -> None:
    assert spec.enh is not None
    copy_references(spec, data, workspace, spec.enh.reference_file, spec.enh.output_file)
