"""Enhancement grader (LDCT denoising, MRI super-resolution): mean SSIM, PSNR as a diagnostic.

The output checks, the data range and the case score are in docs/enhancement-and-detection.md; the
case score is SSIM clipped to [0, 1] (SSIM is negative for an anti-correlated output).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from replay.arrays import ArrayError, npy_header, read_npy
from schemas.task_spec import TaskError, TaskSpec
from scorer.grader.gate import gated_score, mean_score
from scorer.grader.options import EnhWindow, GradeOptions
from scorer.grader.result import CaseResult, GradeResult, invalid_case, missing_case
from scorer.grader.submitted import Rejected, open_submitted
from scorer.metrics import lpips as lpips_metric
from scorer.metrics import psnr as psnr_metric
from scorer.metrics.lpips import Lpips
from scorer.metrics.ssim import SsimParams, reference_data_range, ssim
from tasks.synth import reference_cases


class BadArray(ValueError):
    """A submitted array that cannot be scored; the message is the case's reason."""


def load_npy(f: BinaryIO, name: str, shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """Load a submitted ``.npy`` from a file the grader opened and checked: shape and dtype are
    checked on the header first, so a header that claims a huge array costs nothing, and pickled
    data is never unpickled."""
    try:
        got_shape, got_dtype, _ = npy_header(f)
    except ArrayError as e:
        raise BadArray(f"{name} is {e}") from None
    if got_shape != shape:
        raise BadArray(f"{name} has shape {got_shape}, expected {shape}")
    want = np.dtype(dtype)
    if got_dtype.kind != want.kind or got_dtype.itemsize != want.itemsize:
        raise BadArray(f"{name} has dtype {got_dtype}, expected {dtype}")
    try:
        arr = read_npy(f)
        out = np.array(arr, dtype=want.newbyteorder("="))
    except Exception as e:
        raise BadArray(f"{name} cannot be read ({type(e).__name__}: {e})") from None
    if not np.isfinite(out).all():
        n_nan, n_inf = int(np.isnan(out).sum()), int(np.isinf(out).sum())
        raise BadArray(f"{name} contains non-finite values ({n_nan} NaN, {n_inf} Inf)")
    return out


def read_ranges(path: Path) -> dict[str, float]:
    """``patient_id -> data_range`` from the private CSV; rows without a positive finite range are skipped."""
    out: dict[str, float] = {}
    if not path.is_file():
        return out
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                dr = float(row.get("data_range") or "nan")
            except ValueError:
                continue
            if math.isfinite(dr) and dr > 0 and row.get("patient_id"):
                out[row["patient_id"]] = dr
    return out


def grade_case(
    spec: TaskSpec,
    case: str,
    submission: Path,
    reference: Path,
    ranges: dict[str, float],
    params: SsimParams,
    options: GradeOptions | None = None,
    net: Lpips | None = None,
) -> CaseResult:
    enh = spec.enh
    assert enh is not None
    rel = f"{spec.submission.root}/{case}/{enh.output_file}"
    ref_path = reference / spec.private.case_dir.format(case=case) / enh.reference_file
    try:
        ref = np.load(ref_path, allow_pickle=False)
    except Exception as e:
        raise TaskError(f"reference {ref_path}: unreadable ({type(e).__name__}: {e})") from e
    if ref.ndim != 2 or min(ref.shape) < params.window().size or not np.isfinite(ref).all():
        raise TaskError(
            f"reference {ref_path}: expected a finite 2-D slice at least "
            f"{params.window().size} pixels wide, got shape {ref.shape}"
        )
    try:
        f = open_submitted(submission, rel)
    except Rejected as e:
        if e.kind == "missing":
            return missing_case(case, f"{rel} is missing")
        return invalid_case(case, f"{rel}: {enh.output_file} {e}")
    try:
        with f:
            pred = load_npy(f, enh.output_file, ref.shape, spec.submission.dtype or "float32")
    except BadArray as e:
        return invalid_case(case, f"{rel}: {e}")
    if case in ranges:
        dr, source = ranges[case], enh.ranges_file
    else:
        dr, source = reference_data_range(ref), "reference max-min"
    if not (math.isfinite(dr) and dr > 0):
        return invalid_case(case, f"reference of {case} is constant (data range {dr}); SSIM is undefined")
    if options is not None and options.ssim_dtype == "float32":
        # Finite float32 values can still overflow float32 arithmetic (a square above 3.4e38 from
        # |x| > 1.8e19): such an output is invalid, not an infinite MSE, a NaN SSIM or a traceback.
        try:
            with np.errstate(over="raise"):
                s, p = ssim_float32(ref, pred, dr, params), psnr_float32(ref, pred, dr)
        except FloatingPointError:
            s = p = math.nan
        if not (math.isfinite(s) and math.isfinite(p)):
            return invalid_case(
                case,
                f"{rel}: {enh.output_file} has values too large for SSIM and PSNR in float32 "
                f"(largest magnitude {float(np.abs(pred).max()):.3g})",
            )
    else:
        s, p = ssim(ref, pred, dr, params), psnr_metric.psnr(ref, pred, dr)
    details: dict[str, Any] = {"ssim": s, "psnr_db": p, "data_range": dr, "data_range_source": source}
    if net is not None:
        details["lpips"] = net.distance(pred, ref)
    return CaseResult(case=case, score=min(1.0, max(0.0, s)), details=details)


def ssim_float32(ref: np.ndarray, pred: np.ndarray, data_range: float, params: SsimParams) -> float:
    """SSIM as the enhancement branch computes it: both slices cast to float32 and handed to
    scikit-image (which filters in the input's precision), with the branch's fixed arguments."""
    from skimage.metrics import structural_similarity

    if params != SsimParams():
        raise TaskError("ssim_dtype float32 reproduces the branch's fixed SSIM arguments only")
    return float(
        structural_similarity(
            ref.astype(np.float32),
            pred.astype(np.float32),
            data_range=data_range,
            gaussian_weights=True,
            use_sample_covariance=False,
        )
    )


def psnr_float32(ref: np.ndarray, pred: np.ndarray, data_range: float) -> float:
    """PSNR with the squared error averaged in float32, as ``enhancement_scorer.psnr`` does."""
    diff = pred.astype(np.float32) - ref.astype(np.float32)
    mse = float(np.mean(diff * diff))
    if mse <= psnr_metric.MSE_FLOOR:
        return psnr_metric.PSNR_CAP_DB
    return 10.0 * math.log10(data_range * data_range / mse)


GENERIC_WINDOW = EnhWindow(psnr_low=20.0, psnr_high=50.0, lpips_max=1.0)
"""``enhancement_scorer.clinical_score``'s v1 fallback for a task without its own window."""


def composite(
    cases: Sequence[CaseResult], window: EnhWindow, with_lpips: bool
) -> tuple[float, dict[str, float]]:
    """The enhancement branch's ``clinical_score``: normalised PSNR, SSIM and LPIPS of the dataset
    means, averaged (PSNR and SSIM only when LPIPS is unavailable)."""
    if not cases:
        return 0.0, {}
    mean_psnr = float(np.mean([c.details["psnr_db"] for c in cases]))
    mean_ssim = float(np.mean([c.details["ssim"] for c in cases]))
    parts = {
        "psnr_norm": float(
            np.clip((mean_psnr - window.psnr_low) / (window.psnr_high - window.psnr_low), 0, 1)
        ),
        "ssim_norm": float(np.clip(mean_ssim, 0, 1)),
    }
    if with_lpips:
        mean_lpips = float(np.mean([c.details["lpips"] for c in cases]))
        parts["lpips_norm"] = float(np.clip(1.0 - mean_lpips / window.lpips_max, 0, 1))
    return sum(parts.values()) / len(parts), parts


def grade_track(spec: TaskSpec, submission: Path, reference: Path, options: GradeOptions) -> GradeResult:
    params = msgspec.convert(spec.metric.params, SsimParams)
    assert spec.enh is not None
    ranges = read_ranges(reference / spec.enh.ranges_file)
    ids = reference_cases(reference, spec.enh.reference_file)
    if not ids:
        raise TaskError(f"reference {reference}: no <case>/{spec.enh.reference_file} found")
    degraded: list[str] = []
    net = None
    if options.enh_task_score == "psnr_ssim_lpips":
        try:
            net = lpips_metric.from_environment()
        except lpips_metric.LpipsUnavailable as e:
            degraded.append(f"LPIPS: not computed, {e}; TASK = mean of normalised PSNR and SSIM")
    cases = [grade_case(spec, c, submission, reference, ranges, params, options, net) for c in ids]
    window = options.enh_windows.get(spec.id, GENERIC_WINDOW)
    parts: dict[str, float] = {}

    def aggregate(subset: Sequence[CaseResult]) -> float:
        if options.enh_task_score == "ssim":
            return mean_score(subset)
        value, found = composite([c for c in subset if c.status == "scored"], window, net is not None)
        parts.update(found)
        return value

    score, checks = gated_score(cases, options, aggregate)
    checks.update(parts)
    scored = [c for c in cases if c.status == "scored"]
    if scored:
        checks["mean_ssim_raw"] = float(np.mean([c.details["ssim"] for c in scored]))
        checks["mean_psnr_db"] = float(np.mean([c.details["psnr_db"] for c in scored]))
        if net is not None:
            checks["mean_lpips"] = float(np.mean([c.details["lpips"] for c in scored]))
    return GradeResult(
        task=spec.id,
        metric=spec.metric.name,
        score=score,
        cases=cases,
        params={
            "ssim": params.echo(),
            "psnr": psnr_metric.params(),
            "data_range": f"{spec.enh.ranges_file} data_range per case, else reference max-min",
            "case_score": "ssim clipped to [0, 1]",
            "completeness": options.completeness,
            "ssim_dtype": options.ssim_dtype,
            "task_score": options.enh_task_score,
            **(
                {"window": msgspec.to_builtins(window), "lpips_weights": net.sha256 if net else None}
                if options.enh_task_score != "ssim"
                else {}
            ),
        },
        checks=checks,
        degraded=degraded,
    )
