"""SSIM (Wang et al. 2004) for 2-D slices, numpy only, with pinned and echoed parameters.

The defaults are AutoMedBench's ``skimage.metrics.structural_similarity(..., gaussian_weights=True,
use_sample_covariance=False)``; they travel together in ``SsimParams`` and are echoed into
``GradeResult.params``. ``data_range`` must come from the reference, never from the dtype. Our own
code rather than skimage's: skimage computes in the input's dtype, and on HU slices ``E[x^2] - E[x]^2``
loses digits in float32; we compute in float64 and skip the padded border skimage crops away, so the
result equals skimage's on float64 input without importing scipy (docs/enhancement-and-detection.md).
"""

from __future__ import annotations

import math

import msgspec
import numpy as np


class SsimParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How SSIM is computed. Everything here changes the number."""

    gaussian_weights: bool = True
    sigma: float = 1.5
    truncate: float = 3.5
    win_size: int = 7  # only used for the uniform window; the Gaussian's width follows sigma
    k1: float = 0.01
    k2: float = 0.03
    use_sample_covariance: bool = False

    def window(self) -> np.ndarray:
        """The 1-D window (the 2-D window is its outer product), normalised to sum 1."""
        if self.gaussian_weights:
            radius = int(self.truncate * self.sigma + 0.5)  # as scipy.ndimage.gaussian_filter
            x = np.arange(-radius, radius + 1, dtype=np.float64)
            w = np.exp(-0.5 * (x / self.sigma) ** 2)
        else:
            if self.win_size < 1 or self.win_size % 2 == 0:
                raise ValueError(f"SSIM win_size must be odd and positive, got {self.win_size}")
            w = np.ones(self.win_size, dtype=np.float64)
        return w / w.sum()

    def echo(self) -> dict:
        w = self.window()
        return {**msgspec.to_builtins(self), "window_taps": int(w.size), "compute_dtype": "float64"}


DEFAULT = SsimParams()


def reference_data_range(reference: np.ndarray) -> float:
    """max - min of the reference slice: AutoMedBench's fallback when no range is listed."""
    ref = np.asarray(reference)
    return float(ref.max()) - float(ref.min())


def _valid_filter(img: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Separable correlation with the symmetric window ``w`` along both axes, keeping only
    full-window positions. Symmetry halves the multiplications (``w[k]·(a[k] + a[n-1-k])``), and
    in-place accumulation avoids a temporary per tap: about twice as fast as the plain loop."""
    n, half = w.size, w.size // 2
    h, wd = img.shape
    ow, oh = wd - n + 1, h - n + 1
    rows = img[:, half : half + ow] * w[half]
    tmp = np.empty_like(rows)
    for k in range(half):
        np.add(img[:, k : k + ow], img[:, n - 1 - k : n - 1 - k + ow], out=tmp)
        tmp *= w[k]
        rows += tmp
    out = rows[half : half + oh] * w[half]
    tmp = np.empty_like(out)
    for k in range(half):
        np.add(rows[k : k + oh], rows[n - 1 - k : n - 1 - k + oh], out=tmp)
        tmp *= w[k]
        out += tmp
    return out


def ssim(
    reference: np.ndarray, prediction: np.ndarray, data_range: float, params: SsimParams = DEFAULT
) -> float:
    """Mean SSIM between two 2-D slices of equal shape.

    Raises ValueError for unequal shapes, non-2-D input, a slice smaller than the window, or a
    data range that is not a positive finite number (a constant reference has range 0: its SSIM is
    undefined, and the caller decides what that means).
    """
    ref = np.asarray(reference, dtype=np.float64)
    pred = np.asarray(prediction, dtype=np.float64)
    if ref.ndim != 2 or ref.shape != pred.shape:
        raise ValueError(f"SSIM needs two 2-D slices of one shape, got {ref.shape} and {pred.shape}")
    if not (math.isfinite(data_range) and data_range > 0):
        raise ValueError(f"SSIM data_range must be positive and finite, got {data_range!r}")
    w = params.window()
    if min(ref.shape) < w.size:
        raise ValueError(f"slice {ref.shape} is smaller than the {w.size}-pixel SSIM window")
    n_pix = w.size**2
    cov_norm = n_pix / (n_pix - 1) if params.use_sample_covariance else 1.0
    ux = _valid_filter(ref, w)
    uy = _valid_filter(pred, w)
    vx = cov_norm * (_valid_filter(ref * ref, w) - ux * ux)
    vy = cov_norm * (_valid_filter(pred * pred, w) - uy * uy)
    vxy = cov_norm * (_valid_filter(ref * pred, w) - ux * uy)
    c1 = (params.k1 * data_range) ** 2
    c2 = (params.k2 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return float(s.mean())
