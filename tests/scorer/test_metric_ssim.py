"""SSIM: hand-computed fixtures, the data-range rule, and skimage as the independent reference."""

from __future__ import annotations

import numpy as np
import pytest
from skimage.metrics import structural_similarity

from scorer.metrics.ssim import DEFAULT, SsimParams, reference_data_range, ssim

UNIFORM3 = SsimParams(gaussian_weights=False, win_size=3)


def test_one_window_by_hand():
    # A 3x3 image and the same image + 1 under a 3x3 uniform window: one window, population moments.
    x = np.arange(9, dtype=np.float64).reshape(3, 3)
    y = x + 1
    mx, my, var = 4.0, 5.0, 60.0 / 9.0  # var(0..8) = 60/9; cov(x, x+1) = var
    c1, c2 = (0.01 * 8) ** 2, (0.03 * 8) ** 2
    expected = (2 * mx * my + c1) * (2 * var + c2) / ((mx**2 + my**2 + c1) * (2 * var + c2))
    assert ssim(x, y, 8.0, UNIFORM3) == pytest.approx(expected, abs=1e-15)
    assert expected == pytest.approx(40.0064 / 41.0064, abs=1e-12)


def test_identical_slices_score_exactly_one():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(40, 33)).astype(np.float32)
    assert ssim(a, a, reference_data_range(a)) == 1.0


def test_sample_covariance_factor_by_hand():
    x = np.arange(9, dtype=np.float64).reshape(3, 3)
    y = x[::-1].copy()
    p = SsimParams(gaussian_weights=False, win_size=3, use_sample_covariance=True)
    n = 9
    var = np.var(x) * n / (n - 1)
    cov = np.mean((x - 4) * (y - 4)) * n / (n - 1)
    c1, c2 = (0.01 * 8) ** 2, (0.03 * 8) ** 2
    expected = (2 * 16 + c1) * (2 * cov + c2) / ((32 + c1) * (2 * var + c2))
    assert ssim(x, y, 8.0, p) == pytest.approx(expected, abs=1e-14)


def test_data_range_comes_from_the_reference_not_the_dtype():
    rng = np.random.default_rng(1)
    ref01 = rng.uniform(size=(64, 64))
    pred01 = np.clip(ref01 + rng.normal(0, 0.3, ref01.shape), 0, 1)
    hu_ref, hu_pred = ref01 * 2000, pred01 * 2000
    # SSIM is invariant to a shared scaling when the data range scales with it ...
    assert ssim(hu_ref, hu_pred, reference_data_range(hu_ref)) == pytest.approx(
        ssim(ref01, pred01, reference_data_range(ref01)), abs=1e-9
    )
    # ... while a dtype-sized range (uint16: 65535) inflates it badly, which is why there is no default.
    assert ssim(hu_ref, hu_pred, 65535.0) > ssim(hu_ref, hu_pred, reference_data_range(hu_ref)) + 0.2
    with pytest.raises(TypeError):
        # Why the ignore[call-arg] below: the point: the data range is a required argument.
        ssim(hu_ref, hu_pred)  # type: ignore[call-arg]


@pytest.mark.parametrize("shape", [(15, 15), (64, 80), (129, 100)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(
    "params",
    [
        DEFAULT,
        SsimParams(gaussian_weights=False),
        SsimParams(gaussian_weights=False, use_sample_covariance=True),
        SsimParams(sigma=2.0),
    ],
    ids=["gauss", "uniform7", "uniform7-sample", "gauss-s2"],
)
def test_matches_skimage_on_float64(shape, params):
    rng = np.random.default_rng(sum(shape))
    ref = rng.normal(size=shape).cumsum(0).cumsum(1) * 30 - 500  # smooth, HU-like scale
    pred = ref + rng.normal(0, 25, shape)
    dr = reference_data_range(ref)
    theirs = structural_similarity(
        ref,
        pred,
        data_range=dr,
        gaussian_weights=params.gaussian_weights,
        sigma=params.sigma,
        win_size=None if params.gaussian_weights else params.win_size,
        use_sample_covariance=params.use_sample_covariance,
        K1=params.k1,
        K2=params.k2,
    )
    assert ssim(ref, pred, dr, params) == pytest.approx(theirs, abs=1e-10)


def test_slice_exactly_one_window_wide_matches_skimage():
    rng = np.random.default_rng(3)
    ref, pred = rng.uniform(size=(11, 11)), rng.uniform(size=(11, 11))
    theirs = structural_similarity(
        ref, pred, data_range=1.0, gaussian_weights=True, use_sample_covariance=False
    )
    assert ssim(ref, pred, 1.0) == pytest.approx(theirs, abs=1e-12)


def test_float32_inputs_are_computed_in_float64():
    rng = np.random.default_rng(7)
    ref = (rng.normal(size=(96, 96)).cumsum(0) * 40).astype(np.float32)
    pred = (ref + rng.normal(0, 20, ref.shape)).astype(np.float32)
    dr = reference_data_range(ref)
    theirs64 = structural_similarity(
        ref.astype(np.float64),
        pred.astype(np.float64),
        data_range=dr,
        gaussian_weights=True,
        use_sample_covariance=False,
    )
    assert ssim(ref, pred, dr) == pytest.approx(theirs64, abs=1e-10)


@pytest.mark.parametrize(
    "a_shape,b_shape,dr,match",
    [
        ((16, 16), (16, 15), 1.0, "one shape"),
        ((4, 16, 16), (4, 16, 16), 1.0, "2-D"),
        ((16, 16), (16, 16), 0.0, "data_range"),
        ((16, 16), (16, 16), float("nan"), "data_range"),
        ((8, 40), (8, 40), 1.0, "smaller than"),
    ],
    ids=["shape", "3d", "zero-range", "nan-range", "too-small"],
)
def test_refuses_what_it_cannot_score(a_shape, b_shape, dr, match):
    with pytest.raises(ValueError, match=match):
        ssim(np.zeros(a_shape), np.zeros(b_shape), dr)


def test_params_are_echoed():
    echo = DEFAULT.echo()
    assert echo["window_taps"] == 11 and echo["sigma"] == 1.5 and echo["use_sample_covariance"] is False
    assert echo["compute_dtype"] == "float64"
