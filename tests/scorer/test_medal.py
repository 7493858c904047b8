"""Medal tier and rating per track, against the branches' rules (commits in docs/scoring.md):

- eval_seg/medal_tier.py ``assign_tier`` (good ≥ 0.70, okay ≥ 0.30 on lesion / macro Dice) and
  eval_seg/aggregate.py ``assign_rating`` (F when masks are invalid, else A/B/C by tier; the
  completeness gate sets the tier to 0);
- eval_det2d/medal_tier.py (0.60 / 0.30 on mAP) and aggregate.py ``assign_rating`` (same as seg);
- eval_vqa/medal_tier.py (0.40 / 0.25 on accuracy) and aggregate.py ``assign_rating`` (F when under
  half of the answers are valid — format_checker's submission_format_valid — or none is, or
  completion < 0.5);
- eval_report_gen/aggregate.py ``assign_medal`` (0.80 / 0.55 on the clinical score after the gate)
  and ``assign_rating``;
- eval_image_enhancement/enhancement_scorer.py ``assign_rating`` v3 (F if invalid, aborted or
  under half complete; else the first band of baseline_bands.json met on mean PSNR and SSIM).
"""

from __future__ import annotations

import pytest

from scorer.medal import assess
from scorer.profile import load
from scorer.row import Grade

CODE = load("code-2026-04").profile
PAPER = load("paper-2026-06").profile


def g(task=0.5, n=10, missing=0, invalid=0, **kw) -> Grade:
    return Grade(
        task_score=task,
        n_cases=n,
        n_missing=missing,
        n_invalid=invalid,
        completion=(n - missing) / n,
        format_valid=invalid == 0,
        **kw,
    )


@pytest.mark.parametrize(
    ("track", "value", "medal", "rating"),
    [
        ("segmentation", 0.70, "good", "A"),
        ("segmentation", 0.6999, "okay", "B"),
        ("segmentation", 0.30, "okay", "B"),
        ("segmentation", 0.2999, "fail", "C"),
        ("detection", 0.60, "good", "A"),
        ("detection", 0.59, "okay", "B"),
        ("detection", 0.29, "fail", "C"),
        ("vqa", 0.40, "good", "A"),
        ("vqa", 0.25, "okay", "B"),
        ("vqa", 0.24, "fail", "C"),
        ("report", 0.80, "good", "A"),
        ("report", 0.55, "okay", "B"),
        ("report", 0.5499, "fail", "C"),
    ],
)
def test_thresholds(track, value, medal, rating):
    r = assess(
        g(task=value, medal_metric=value if track in ("segmentation", "detection") else None),
        "t",
        CODE.medals[track],
    )
    assert (r.medal, r.rating, r.valid) == (medal, rating, True)


def test_seg_medal_reads_lesion_dice_not_task():
    # run_eval: assign_tier(mean_lesion_dice); TASK (0.5·organ + 0.5·lesion) may be higher.
    r = assess(g(task=0.62, medal_metric=0.25), "kidney-seg", CODE.medals["segmentation"])
    assert r.medal == "fail" and r.rating == "C"
    # The paper profile reads TASK.
    assert assess(g(task=0.62, medal_metric=0.25), "kidney-seg", PAPER.medals["segmentation"]).medal == "okay"


def test_incomplete_or_invalid_is_f():
    seg = CODE.medals["segmentation"]
    r = assess(g(task=0.0, missing=1, medal_metric=0.9, gate_zeroed=True), "t", seg)
    assert (r.medal, r.rating, r.valid) == ("fail", "F", False)
    # A wrong-shaped mask leaves TASK standing (0.9375) but masks are invalid: F.
    r = assess(g(task=0.9375, invalid=1, medal_metric=1.0), "t", seg)
    assert (r.medal, r.rating) == ("good", "F")


def test_vqa_coverage_rule():
    vqa = CODE.medals["vqa"]
    assert assess(g(task=0.45, missing=5), "t", vqa).rating == "A"  # half present, half valid
    assert assess(g(task=0.45, missing=6), "t", vqa).rating == "F"  # under half
    assert assess(g(task=0.45, invalid=6), "t", vqa).rating == "F"  # under half valid
    assert assess(g(task=0.0, invalid=10), "t", vqa).rating == "F"  # no valid output


@pytest.mark.parametrize(
    ("psnr", "ssim", "rating", "medal"),
    [
        (42.798, 0.9863, "A", "good"),
        (42.8, 0.98, "B", "okay"),
        (40.798, 0.9463, "B", "okay"),
        (39.0, 0.95, "C", "fail"),
        (38.0, 0.99, "F", "fail"),  # PSNR below every band
    ],
)
def test_enhancement_bands(psnr, ssim, rating, medal):
    r = assess(
        g(task=0.7, mean_psnr_db=psnr, mean_ssim_raw=ssim), "ldct-denoising", CODE.medals["enhancement"]
    )
    assert (r.rating, r.medal) == (rating, medal)


def test_enhancement_incomplete_is_f():
    r = assess(
        g(task=0.9, missing=1, mean_psnr_db=50, mean_ssim_raw=0.99),
        "ldct-denoising",
        CODE.medals["enhancement"],
    )
    assert r.rating == "F" and not r.valid


def test_no_grade_no_medal_and_breach_is_f():
    r = assess(Grade(task_score=None, reason="no references"), "t", CODE.medals["vqa"])
    assert r.medal is None and r.rating is None and "no references" in (r.reason or "")
    assert assess(Grade(), "t", CODE.medals["vqa"], breach=True).rating == "F"
