"""PSNR: hand-computed values, the 99 dB cap, and skimage as the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scorer.metrics.psnr import PSNR_CAP_DB, params, psnr


def test_by_hand():
    ref = np.zeros((2, 2))
    pred = np.array([[1.0, 0.0], [0.0, 0.0]])
    assert psnr(ref, pred, 1.0) == pytest.approx(10 * math.log10(4), abs=1e-12)  # MSE 1/4
    assert psnr(ref, pred * 100, 100.0) == pytest.approx(10 * math.log10(4), abs=1e-12)


def test_identical_is_capped_at_99():
    a = np.linspace(-1000, 1000, 64).reshape(8, 8)
    assert psnr(a, a, 2000.0) == PSNR_CAP_DB
    assert psnr(a, a + 1e-7, 2000.0) == PSNR_CAP_DB  # MSE 1e-14 <= 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_skimage(seed):
    from skimage.metrics import peak_signal_noise_ratio

    rng = np.random.default_rng(seed)
    ref = rng.uniform(-1000, 2000, (50, 40)).astype(np.float32)
    pred = ref + rng.normal(0, 30, ref.shape).astype(np.float32)
    dr = float(ref.max() - ref.min())
    assert psnr(ref, pred, dr) == pytest.approx(
        peak_signal_noise_ratio(ref.astype(np.float64), pred.astype(np.float64), data_range=dr), abs=1e-9
    )


def test_refuses_bad_input():
    with pytest.raises(ValueError, match="one shape"):
        psnr(np.zeros((2, 2)), np.zeros((2, 3)), 1.0)
    with pytest.raises(ValueError, match="data_range"):
        psnr(np.zeros((2, 2)), np.ones((2, 2)), 0.0)


def test_params_echo():
    assert params() == {"cap_db": 99.0, "mse_floor": 1e-12, "compute_dtype": "float64"}
