"""PSNR, a diagnostic beside SSIM for the enhancement track (numpy only).

Written by hand because ``skimage.metrics.peak_signal_noise_ratio`` pulls in ``scipy.stats`` (about
0.7 s of import). The data range comes from the reference; AutoMedBench's 99 dB cap at MSE <= 1e-12
is pinned here and echoed with the score.
"""

from __future__ import annotations

import math

import numpy as np

PSNR_CAP_DB = 99.0
MSE_FLOOR = 1e-12


def params() -> dict:
    return {"cap_db": PSNR_CAP_DB, "mse_floor": MSE_FLOOR, "compute_dtype": "float64"}


def psnr(reference: np.ndarray, prediction: np.ndarray, data_range: float) -> float:
    """10·log10(data_range² / MSE) in dB, computed in float64; 99 dB when MSE ≤ 1e-12."""
    ref = np.asarray(reference, dtype=np.float64)
    pred = np.asarray(prediction, dtype=np.float64)
    if ref.shape != pred.shape:
        raise ValueError(f"PSNR needs arrays of one shape, got {ref.shape} and {pred.shape}")
    if not (math.isfinite(data_range) and data_range > 0):
        raise ValueError(f"PSNR data_range must be positive and finite, got {data_range!r}")
    diff = ref - pred
    mse = float(np.mean(diff * diff))
    if mse <= MSE_FLOOR:
        return PSNR_CAP_DB
    return 10.0 * math.log10(data_range * data_range / mse)
