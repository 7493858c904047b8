"""LPIPS (Zhang et al. 2018, AlexNet variant, version 0.1) in numpy, from a local weights file.

It reproduces the ``lpips`` package (``net="alex"``) that AutoMedBench's enhancement branch uses,
in float32 as its PyTorch forward pass does; numpy keeps torch out of the dependencies. The weights
cannot be downloaded at run time: they are read from the ``.npz`` named by ``AMB_LPIPS_WEIGHTS``,
under the names of the PyTorch state dicts they come from (torchvision's AlexNet
``features.{0,3,6,8,10}.{weight,bias}``, lpips's ``lin{0..4}.model.1.weight``). Without that file the
metric is unavailable and the caller says so (``degraded``); nothing is substituted silently.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from schemas.blob import digest

ENV = "AMB_LPIPS_WEIGHTS"
SHIFT = np.array([-0.030, -0.088, -0.188])
SCALE = np.array([0.458, 0.448, 0.450])
# (state-dict index, out channels, in channels, kernel, stride, padding, max-pool before the conv)
CONVS = (
    (0, 64, 3, 11, 4, 2, False),
    (3, 192, 64, 5, 1, 2, True),
    (6, 384, 192, 3, 1, 1, True),
    (8, 256, 384, 3, 1, 1, False),
    (10, 256, 256, 3, 1, 1, False),
)
EPS = 1e-10


class LpipsUnavailable(Exception):
    """No usable weights file; the message is the reason recorded in ``degraded``."""


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """Every array the weights file must hold, with its shape."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (idx, out, inp, k, *_rest) in enumerate(CONVS):
        shapes[f"features.{idx}.weight"] = (out, inp, k, k)
        shapes[f"features.{idx}.bias"] = (out,)
        shapes[f"lin{i}.model.1.weight"] = (1, out, 1, 1)
    return shapes


class Lpips:
    """A loaded network; ``distance(a, b)`` is the LPIPS between two 2-D images."""

    def __init__(self, weights: dict[str, np.ndarray], sha256: str):
        self.w = weights
        self.sha256 = sha256

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Lpips:
        p = Path(path)
        try:
            raw = p.read_bytes()
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: np.asarray(z[k], dtype=np.float32) for k in z.files}
        except Exception as e:  # numpy raises many kinds for a bad archive
            raise LpipsUnavailable(f"LPIPS weights {p}: unreadable ({type(e).__name__}: {e})") from None
        for name, shape in expected_shapes().items():
            if name not in arrays:
                raise LpipsUnavailable(f"LPIPS weights {p}: no array {name!r}")
            if arrays[name].shape != shape:
                raise LpipsUnavailable(
                    f"LPIPS weights {p}: {name} has shape {arrays[name].shape}, expected {shape}"
                )
        return cls(arrays, digest(raw))

    def features(self, img: np.ndarray) -> list[np.ndarray]:
        x = _to_input(img)
        out = []
        for idx, _o, _i, _k, stride, pad, pool in CONVS:
            if pool:
                x = _max_pool(x)
            x = _conv(x, self.w[f"features.{idx}.weight"], self.w[f"features.{idx}.bias"], stride, pad)
            x = np.maximum(x, 0.0)
            out.append(x / (np.sqrt((x * x).sum(axis=0, keepdims=True)) + EPS))
        return out

    def distance(self, a: np.ndarray, b: np.ndarray) -> float:
        total = 0.0
        for i, (fa, fb) in enumerate(zip(self.features(a), self.features(b), strict=True)):
            lin = self.w[f"lin{i}.model.1.weight"].reshape(-1, 1, 1)
            total += float((lin * (fa - fb) ** 2).sum(axis=0, dtype=np.float64).mean())
        return total


def _to_input(img: np.ndarray) -> np.ndarray:
    """[-1, 1] min-max scaling of one image (all zeros when constant), three channels, lpips's
    per-channel shift and scale."""
    x = np.asarray(img, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"LPIPS needs a 2-D image, got shape {x.shape}")
    lo, hi = float(x.min()), float(x.max())
    x = np.zeros_like(x) if hi - lo < 1e-9 else ((x - lo) / (hi - lo) * 2.0 - 1.0).astype(np.float32)
    shift, scale = SHIFT.astype(np.float32), SCALE.astype(np.float32)
    return (x[None, :, :] - shift[:, None, None]) / scale[:, None, None]


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """Cross-correlation of ``x`` (C, H, W) with ``w`` (O, C, k, k), zero padding, then bias: the
    k·k shifted (strided) copies of the input form one contiguous column matrix, multiplied once."""
    c, k = x.shape[0], w.shape[-1]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    oh = (xp.shape[1] - k) // stride + 1
    ow = (xp.shape[2] - k) // stride + 1
    cols = np.empty((c, k, k, oh, ow), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, i, j] = _strided(xp, i, j, stride, oh, ow)
    y = w.reshape(w.shape[0], -1) @ cols.reshape(c * k * k, oh * ow)
    return y.reshape(-1, oh, ow) + b[:, None, None]


def _max_pool(x: np.ndarray, k: int = 3, stride: int = 2) -> np.ndarray:
    oh = (x.shape[1] - k) // stride + 1
    ow = (x.shape[2] - k) // stride + 1
    out = _strided(x, 0, 0, stride, oh, ow).copy()
    for i in range(k):
        for j in range(k):
            np.maximum(out, _strided(x, i, j, stride, oh, ow), out=out)
    return out


def _strided(x: np.ndarray, i: int, j: int, stride: int, oh: int, ow: int) -> np.ndarray:
    """The ``oh`` × ``ow`` positions of a stride-``stride`` window offset by (i, j), of every channel."""
    return x[:, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride]


_loaded: dict[str, Lpips] = {}


def from_environment() -> Lpips:
    """The network named by ``AMB_LPIPS_WEIGHTS`` (loaded once per process), or LpipsUnavailable."""
    path = os.environ.get(ENV, "")
    if not path:
        raise LpipsUnavailable(f"network weights not available here (set {ENV} to a local .npz)")
    if path not in _loaded:
        _loaded[path] = Lpips.load(path)
    return _loaded[path]


def weights_digest() -> str | None:
    """The digest of the configured weights (part of a grade's cache key), or None."""
    try:
        return from_environment().sha256
    except LpipsUnavailable:
        return None
