"""LPIPS from a local weights file: the numpy network against an independent loop implementation.

No real LPIPS weights can be downloaded here, so a weights file of the right names and shapes is
generated with a fixed seed (non-negative 1x1 weights, as lpips's trained layers are). The
reference below is written from the lpips paper's description with scipy's correlate and explicit
loops, sharing no code with ``scorer.metrics.lpips``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy.signal import correlate

from scorer.metrics import lpips
from scorer.metrics.lpips import CONVS, Lpips, LpipsUnavailable, expected_shapes


def make_weights(path, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in expected_shapes().items():
        fan_in = int(np.prod(shape[1:])) or 1
        a = rng.normal(0, 1 / np.sqrt(fan_in), shape)
        arrays[name] = np.abs(a) if name.startswith("lin") else a
    savez: Any = np.savez  # typed with an allow_pickle keyword that **arrays would seem to hit
    savez(path, **arrays)
    return arrays


def reference_lpips(w, a, b):
    def prep(img):
        img = img.astype(np.float64)
        lo, hi = img.min(), img.max()
        x = (img - lo) / (hi - lo) * 2 - 1
        x = np.stack([x, x, x])
        shift, scale = [-0.030, -0.088, -0.188], [0.458, 0.448, 0.450]
        return np.stack([(x[c] - shift[c]) / scale[c] for c in range(3)])

    def conv(x, weight, bias, stride, pad):
        # One 3-D correlation per output channel: the kernel spans every input channel, so the
        # "valid" result has a single channel, the sum over input channels.
        x = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
        out = []
        for o in range(weight.shape[0]):
            acc = correlate(x, weight[o], mode="valid", method="direct")[0]
            out.append(acc[::stride, ::stride] + bias[o])
        return np.array(out)

    def pool(x):
        c, h, wd = x.shape
        oh, ow = (h - 3) // 2 + 1, (wd - 3) // 2 + 1
        out = np.empty((c, oh, ow))
        for i in range(oh):
            for j in range(ow):
                out[:, i, j] = x[:, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].max(axis=(1, 2))
        return out

    def feats(img):
        x, fs = prep(img), []
        for idx, _o, _i, _k, stride, pad, pooled in CONVS:
            if pooled:
                x = pool(x)
            x = np.maximum(conv(x, w[f"features.{idx}.weight"], w[f"features.{idx}.bias"], stride, pad), 0)
            fs.append(x / (np.sqrt((x**2).sum(axis=0)) + 1e-10))
        return fs

    total = 0.0
    for i, (fa, fb) in enumerate(zip(feats(a), feats(b), strict=True)):
        lin = w[f"lin{i}.model.1.weight"][0, :, 0, 0]
        total += float(np.mean(np.tensordot(lin, (fa - fb) ** 2, axes=1)))
    return total


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("lpips") / "alex.npz"
    return path, make_weights(path)


def test_matches_independent_reference(weights):
    path, w = weights
    rng = np.random.default_rng(4)
    a = rng.normal(0, 1, (48, 40)).cumsum(axis=0)
    b = a + rng.normal(0, 3, a.shape)
    net = Lpips.load(path)
    got = net.distance(b, a)
    # float32 network against a float64 reference: agreement to float32 precision.
    assert got == pytest.approx(reference_lpips(w, b, a), rel=1e-5)
    assert got > 0 and net.distance(a, a) == 0.0
    assert net.distance(a, b) == pytest.approx(got, rel=1e-6)  # symmetric
    assert net.distance(a * 7 + 3, a) == pytest.approx(0.0, abs=1e-6)  # min-max scaled per image


def test_environment_and_bad_files(weights, tmp_path, monkeypatch):
    path, w = weights
    monkeypatch.delenv(lpips.ENV, raising=False)
    with pytest.raises(LpipsUnavailable, match="not available"):
        lpips.from_environment()
    assert lpips.weights_digest() is None
    monkeypatch.setenv(lpips.ENV, str(path))
    assert lpips.weights_digest() == lpips.from_environment().sha256
    bad = dict(w)
    bad["lin2.model.1.weight"] = np.ones((1, 10, 1, 1))
    savez: Any = np.savez
    savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(LpipsUnavailable, match="lin2.model.1.weight has shape"):
        Lpips.load(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_bytes(b"not an archive")
    with pytest.raises(LpipsUnavailable, match="unreadable"):
        Lpips.load(tmp_path / "junk.npz")
    del bad["features.0.bias"]
    savez(tmp_path / "short.npz", **bad)
    with pytest.raises(LpipsUnavailable, match="no array"):
        Lpips.load(tmp_path / "short.npz")


def test_enhancement_grade_uses_lpips_when_weights_are_given(weights, tmp_path, monkeypatch):
    """With a weights file the composite is (PSNR_n + SSIM_n + LPIPS_n) / 3 of the dataset means
    (enhancement_scorer.clinical_score) and nothing is degraded."""
    from scorer.grader import grade
    from scorer.grader.options import options_from_table
    from scorer.profile import load
    from tasks import synth
    from tasks.registry import load_spec

    path, _ = weights
    monkeypatch.setenv(lpips.ENV, str(path))
    spec = load_spec("mri-sr")
    synth.synth(spec, tmp_path / "data", cases=2, seed=1)
    ws = tmp_path / "ws"
    synth.perfect_submission(spec, tmp_path / "data", ws)
    rng = np.random.default_rng(2)
    for p in sorted((ws / spec.submission.root).glob("*/enhanced.npy")):
        arr = np.load(p)
        np.save(p, (arr + rng.normal(0, 0.02, arr.shape)).astype(np.float32))
    o = options_from_table(load("code-2026-04").profile.metrics_for("enhancement"))
    r = grade(spec, ws, tmp_path / "data" / "private", o)
    assert r.degraded == [] and r.params["lpips_weights"] == lpips.from_environment().sha256
    mean_lpips = float(np.mean([c.details["lpips"] for c in r.cases]))
    assert mean_lpips > 0
    psnr_n = min(1, max(0, (r.checks["mean_psnr_db"] - 20.0) / 15.0))
    ssim_n = min(1, max(0, r.checks["mean_ssim_raw"]))
    lpips_n = min(1, max(0, 1 - mean_lpips / 0.5))
    assert r.score == pytest.approx((psnr_n + ssim_n + lpips_n) / 3, abs=1e-12)
