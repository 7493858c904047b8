"""Grade options: the switches where the paper and the public code disagree.

A scoring profile's ``[metrics]`` table maps one-to-one onto ``GradeOptions`` (unknown keys are an
error, so a typo never falls back to a default silently). The defaults follow the paper where it is
explicit; each alternative is named after where it comes from (docs/scoring.md).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from schemas.errors import UsageError


class EnhWindow(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Linear normalisation windows of the enhancement composite (``enhancement_scorer.TASK_NORM``)."""

    psnr_low: float
    psnr_high: float
    lpips_max: float


class GradeOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a submission is turned into a TASK score."""

    completeness: Literal[
        "per_case_zero", "all_or_nothing", "times_completion", "all_or_nothing_missing", "mean_over_valid"
    ] = "per_case_zero"
    """A missing or invalid case: scores 0 and stays in the mean (paper, Appendix A); zeroes the whole
    TASK (public code, paper Appendix B); or the mean over scored cases × the completed fraction
    (Full harness / website). ``all_or_nothing_missing``: only a *missing* case zeroes the TASK; a
    present but invalid one stays in and is scored by the track's rule (eval_seg: a case is complete
    when its files exist). ``mean_over_valid``: the aggregate over the valid cases only, missing and
    invalid ones left out, 0 when none is valid (eval_image_enhancement ``score_all``: NaN cases are
    dropped from the means)."""

    seg_formula: Literal["organ_lesion_50_50", "organ_lesion_25_75", "per_case_macro"] = "organ_lesion_50_50"
    """Binary organ+lesion tasks: 0.5·organ + 0.5·lesion on dataset-level means (public code's
    ``2026-04-sub-criteria``); 0.25·organ + 0.75·lesion (the earlier rubric, matched by the paper's
    example trace); or per case the mean over its targets, then over cases (paper, Appendix A)."""
    seg_invalid_case: Literal["zero", "drop", "organ_zero_lesion_drop"] = "zero"
    """A binary case with a shape mismatch: Dice 0 (paper), dropped from the means, or per target as
    eval_seg's ``dice_scorer.score_all`` + ``aggregate.build_report`` do: a wrong-shaped organ mask
    counts organ Dice 0 in the organ mean, a wrong-shaped lesion mask leaves the case out of the
    lesion mean, and the other target of the case is scored normally."""
    seg_multiclass_empty: Literal["both_empty_is_one", "skip_gt_empty"] = "both_empty_is_one"
    """Multiclass: a class empty in both prediction and reference counts as Dice 1 (Full scorer), or
    (case, class) pairs with an empty reference are left out (the config text's "GT-nonempty")."""

    vqa_matching: Literal["exact", "em_f1"] = "exact"
    """Open-ended VQA: 0/1 exact match after normalisation (paper) or 0.5·EM + 0.5·token-F1 (code)."""
    text_level: Literal["case", "corpus"] = "case"
    """Report score: per-case metrics averaged (paper) or corpus-level metrics (public code)."""

    ap_interpolation: Literal["voc_all_point", "coco_101"] = "voc_all_point"
    """Detection AP: VOC all-point (paper) or the public code's 101-point interpolation."""
    det_class_set: Literal["with_gt", "union"] = "with_gt"
    """Detection: average AP over the classes that have reference boxes (paper's "the task's
    classes", the Full brief, COCO) or over every class named by a reference or a prediction, a class
    without reference boxes scoring AP 0 (public code)."""
    det_wildcard: bool = True
    """Detection: a box labelled with the task's wildcard class (``abnormality``) matches every class
    (public code; the paper is silent)."""
    ssim_dtype: Literal["float64", "float32"] = "float64"
    """Enhancement: SSIM and PSNR computed in float64 (exact) or in float32 as the enhancement branch
    does (``enhancement_scorer._as_float32_2d`` before ``structural_similarity``)."""
    enh_task_score: Literal["ssim", "psnr_ssim_lpips"] = "ssim"
    """Enhancement TASK: mean SSIM (paper) or the enhancement branch's ``clinical_score``: the mean of
    normalised PSNR, SSIM and LPIPS over the dataset means, with per-task windows ``enh_windows``.
    Without LPIPS weights (env ``AMB_LPIPS_WEIGHTS``) the LPIPS part is left out and listed in
    ``degraded``."""
    enh_windows: dict[str, EnhWindow] = {}
    """Per task id: the PSNR window and LPIPS maximum of ``psnr_ssim_lpips`` (others: the branch's
    generic v1 window, PSNR 20-50 dB, LPIPS 0-1)."""


def options_from_table(table: dict[str, Any], *, source: str = "profile") -> GradeOptions:
    """``GradeOptions`` from a profile's ``[metrics]`` table; a bad key or value is one clear error."""
    try:
        return msgspec.convert(table, GradeOptions)
    except msgspec.ValidationError as e:
        raise UsageError(f"{source}: [metrics]: {e}") from e
