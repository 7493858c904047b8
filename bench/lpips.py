"""LPIPS in numpy (scorer/metrics/lpips.py): time per 512x512 pair, and parity with PyTorch.

Without ``--weights`` a weights file of the right names and shapes is generated (seeded), so the
figure measures the arithmetic, not a trained network. When ``torch`` is importable (it is not a
dependency of the project: ``pip install torch`` in a separate environment), the same forward pass
is also run through ``torch.nn.functional`` in float32 with the same weights, and the largest
difference between the two LPIPS values is printed, with the ratio of the two run times.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

import numpy as np

from bench import figures
from bench.measure import timed
from scorer.metrics.lpips import CONVS, SCALE, SHIFT, Lpips, expected_shapes


def make_weights(path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for name, shape in expected_shapes().items():
        a = rng.normal(0, 1 / np.sqrt(max(1, int(np.prod(shape[1:])))), shape)
        arrays[name] = np.abs(a) if name.startswith("lin") else a
    savez: Any = np.savez  # typed with an allow_pickle keyword that **arrays would seem to hit
    savez(path, **arrays)


def torch_lpips(w: dict[str, np.ndarray], a: np.ndarray, b: np.ndarray) -> float:
    import torch
    import torch.nn.functional as F

    def prep(img: np.ndarray):
        lo, hi = float(img.min()), float(img.max())
        x = np.zeros_like(img) if hi - lo < 1e-9 else (img - lo) / (hi - lo) * 2 - 1
        t = torch.from_numpy(x.astype(np.float32))[None, None].repeat(1, 3, 1, 1)
        shift = torch.tensor(SHIFT, dtype=torch.float32)[None, :, None, None]
        scale = torch.tensor(SCALE, dtype=torch.float32)[None, :, None, None]
        return (t - shift) / scale

    def feats(x):
        out = []
        for idx, _o, _i, _k, stride, pad, pooled in CONVS:
            if pooled:
                x = F.max_pool2d(x, 3, 2)
            weight = torch.from_numpy(w[f"features.{idx}.weight"].astype(np.float32))
            bias = torch.from_numpy(w[f"features.{idx}.bias"].astype(np.float32))
            x = F.relu(F.conv2d(x, weight, bias, stride=stride, padding=pad))
            out.append(x / (torch.sqrt((x * x).sum(dim=1, keepdim=True)) + 1e-10))
        return out

    with torch.no_grad():
        total = 0.0
        for i, (fa, fb) in enumerate(zip(feats(prep(a)), feats(prep(b)), strict=True)):
            lin = torch.from_numpy(w[f"lin{i}.model.1.weight"].astype(np.float32))
            total += float(F.conv2d((fa - fb) ** 2, lin).mean())
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", type=Path, metavar="FILE", default=None)
    ap.add_argument("--pairs", type=int, default=5)
    figures.add_argument(ap, "lpips")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    seconds, beside = measure(args)
    weights = "trained" if args.weights else "generated"
    figs.add(
        "pair",
        f"LPIPS in numpy on 512×512 pairs ({args.pairs}, {weights} weights)",
        f"{seconds * 1000:.0f} ms per pair",
        beside,
    )
    figs.write()


def measure(args: argparse.Namespace) -> tuple[float, str]:
    """Seconds per pair in numpy, and the torch float32 baseline (or why there is none)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = args.weights or Path(tmp) / "alex.npz"
        if args.weights is None:
            make_weights(path)
        net = Lpips.load(path)
        rng = np.random.default_rng(1)
        walks = (rng.normal(0, 1, (512, 512)).cumsum(axis=0).cumsum(axis=1) for _ in range(args.pairs))
        pairs = [(a + rng.normal(0, 20, a.shape), a) for a in walks]
        ours, t_np = timed(lambda: [net.distance(p, r) for p, r in pairs])
        t_np /= len(pairs)
        print(f"numpy LPIPS: {t_np * 1000:.0f} ms per 512x512 pair ({len(pairs)} pairs)")
        try:
            import torch  # noqa: F401  (F401: only probing whether the optional parity check can run)
        except ImportError:
            print("torch not importable: parity check skipped (install torch in this environment to run it)")
            return t_np, "torch not installed: not measured"
        ref, t_t = timed(lambda: [torch_lpips(net.w, p, r) for p, r in pairs])
        t_t /= len(pairs)
        diff = max(abs(x - y) for x, y in zip(ours, ref, strict=True))
        rel = max(abs(x - y) / abs(y) for x, y in zip(ours, ref, strict=True))
        print(f"torch float32 LPIPS: {t_t * 1000:.0f} ms per pair; numpy/torch time ratio {t_np / t_t:.2f}")
        lo, hi = min(ref), max(ref)
        print(f"largest |numpy - torch| = {diff:.3g} (relative {rel:.3g}) over values {lo:.4f}..{hi:.4f}")
    return t_np, f"torch float32: {t_t * 1000:.0f} ms per pair; largest difference {diff:.1e}"


if __name__ == "__main__":
    main()
