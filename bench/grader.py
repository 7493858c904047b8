"""bench/grader: the grader's metrics beside the obvious baseline, each measured in this process.

Measures:
- Dice on two 512×512×300 uint8 label volumes with 2, 14 and 117 foreground labels: the one-pass
  confusion matrix (``scorer.metrics.dice``) vs one boolean mask pair per label; time, peak memory
  allocated by the metric (tracemalloc sees numpy's buffers) and the largest Dice difference.
  Ours is the best of 3 runs (the machine is shared); the slow baseline runs once.
  Targets: ≤ 0.6 s and ≤ 1 GB for each label count, i.e. independent of the label count;
- one whole case graded from .nii.gz files (read, checks, Dice) with TotalSegmentator's 117 labels;
- SSIM on 100 512×512 slices and mAP on 1,000 images (``bench/grader_enh_det.py``);
- the report score on 500 reports (``bench/grader_report.py``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import tracemalloc
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import numpy as np

from bench import figures
from bench.figures import NONE
from bench.measure import peak_rss_mb, repeat, timed
from scorer.metrics.dice import binary_counts, binary_dice, multiclass_dice


def measured(fn, times: int = 1):
    """(result, best seconds of ``times`` runs, peak bytes allocated during a call)."""
    warm_up = repeat(fn, times - 1)  # the machine is shared: report the best
    tracemalloc.start()
    tracemalloc.reset_peak()
    out, seconds = timed(fn)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, min([seconds, *warm_up]), peak


def per_label_masks(pred: np.ndarray, ref: np.ndarray, labels: list[int]) -> dict[int, float]:
    """The baseline: a boolean mask pair (and their intersection) per label."""
    out = {}
    for lab in labels:
        p, g = pred == lab, ref == lab
        denom = int(np.count_nonzero(p)) + int(np.count_nonzero(g))
        out[lab] = 1.0 if denom == 0 else 2.0 * int(np.count_nonzero(p & g)) / denom
    return out


def label_volumes(shape: tuple[int, int, int], n_labels: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A reference of blocky organs (runs of labels along x) and a prediction with 10 % of voxels
    relabelled."""
    rng = np.random.default_rng(seed)
    ref = np.asfortranarray(
        rng.integers(0, n_labels + 1, (shape[0] // 8 + 1, shape[1], shape[2]), dtype=np.uint8).repeat(
            8, axis=0
        )[: shape[0]]
    )
    pred = ref.copy(order="F")
    flip = rng.random(shape, dtype=np.float32) < 0.1
    pred[flip] = rng.integers(0, n_labels + 1, int(flip.sum()), dtype=np.uint8)
    return pred, ref


def bench_dice(
    figs: figures.Figures, shape: tuple[int, int, int], label_counts: list[int], baseline: bool
) -> None:
    nvox = int(np.prod(shape))
    ours_s, peaks, masks_s, diffs = [], [], [], []
    for k in label_counts:
        pred, ref = label_volumes(shape, k)
        labels = list(range(1, k + 1))
        ours, seconds, peak = measured(partial(multiclass_dice, pred, ref, labels), times=3)
        ours_s.append(seconds)
        peaks.append(peak)
        if baseline:
            base, seconds, _ = measured(partial(per_label_masks, pred, ref, labels))
            masks_s.append(seconds)
            diffs.append(max(abs(ours[lab] - base[lab]) for lab in labels))
        del pred, ref
    ok = max(ours_s) <= 0.6 and max(peaks) + 2 * nvox <= 2**30
    figs.add(
        "dice",
        f"Dice, {'×'.join(map(str, shape))} label volumes, {' / '.join(map(str, label_counts))} labels",
        " / ".join(f"{t:.2f}" for t in ours_s)
        + f" s, at most {max(peaks) / 2**20:.0f} MiB beyond the inputs",
        f"one mask pair per label: {' / '.join(f'{t:.2f}' for t in masks_s)} s; "
        f"largest difference {max(diffs):.1e}"
        if baseline
        else NONE,
        f"≤ 0.6 s, ≤ 1 GiB ({figures.met(ok)})",
    )


def bench_binary(shape: tuple[int, int, int], baseline: bool) -> None:
    """Organ + lesion masks (the binary tasks): both targets counted in one slab-wise pass."""
    pred, ref = label_volumes(shape, 2, seed=2)  # 1 = organ, 2 = lesion inside it
    po, ro, pl, rl = pred >= 1, ref >= 1, pred == 2, ref == 2
    (mo, ml), t_ours, m_ours = measured(lambda: binary_counts([(po, ro), (pl, rl)]), times=3)
    line = f"organ + lesion masks, one slab-wise pass: {t_ours:.3f} s, peak {m_ours / 2**20:.0f} MiB"
    if baseline:
        base, t_base, _ = measured(lambda: (per_label_masks(po, ro, [True]), per_label_masks(pl, rl, [True])))
        diff = max(abs(binary_dice(mo) - base[0][True]), abs(binary_dice(ml) - base[1][True]))
        line += f"; two mask pairs {t_base:.3f} s, largest difference {diff:.1e}"
    print(line)


def bench_grade_case(shape: tuple[int, int, int]) -> None:
    """One TotalSegmentator-like case graded end to end from gzipped NIfTI files."""
    import nibabel as nib

    from scorer.grader import grade
    from scorer.grader.options import GradeOptions
    from tasks.registry import load_spec

    spec = load_spec("tsg-multiorgan-seg")
    pred, ref = label_volumes(shape, 117, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for side, data in (("private/case", ref), ("ws/agents_outputs/case", pred)):
            (root / side).mkdir(parents=True)
            nib.save(nib.Nifti1Image(data, np.eye(4)), str(root / side / "dseg.nii.gz"))
        del pred, ref
        result, seconds, peak = measured(lambda: grade(spec, root / "ws", root / "private", GradeOptions()))
    print(
        f"one case graded from .nii.gz (117 labels): {seconds:.2f} s, peak {peak / 2**20:.0f} MiB, "
        f"macro Dice {result.score:.4f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=3, default=[512, 512, 300])
    ap.add_argument("--labels", type=int, nargs="+", default=[2, 14, 117])
    ap.add_argument("--skip-baseline", action="store_true", help="Skip the slow per-label-mask baseline.")
    ap.add_argument("--only", choices=["dice", "ssim", "map", "report"], help="Run one part only.")
    ap.add_argument("--slices", type=int, default=100)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--reports", type=int, default=500)
    figures.add_argument(ap, "grader")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    shape = tuple(args.shape)

    if args.only in (None, "dice"):
        bench_dice(figs, shape, args.labels, not args.skip_baseline)
        bench_binary(shape, not args.skip_baseline)
        bench_grade_case(shape)

    if args.only in (None, "ssim"):
        from bench.grader_enh_det import bench_ssim

        bench_ssim(figs, args.slices)
    if args.only in (None, "map"):
        from bench.grader_enh_det import bench_map

        bench_map(figs, args.images)
    if args.only in (None, "report"):
        from bench.grader_report import bench_report

        bench_report(figs, args.reports)
    print(f"process peak RSS {peak_rss_mb() / 1024:.2f} GiB")
    figs.write()


if __name__ == "__main__":
    main()
