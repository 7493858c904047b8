"""AGENTIC and OVERALL per track under ``code-2026-04`` on a grid of stage inputs, unscored ones
included, against values computed by hand from each branch's ``compute_workflow_score`` and
``compute_overall_score`` (commits in docs/scoring.md):

- eval_seg/aggregate.py, eval_det2d/aggregate.py, eval_report_gen/aggregate.py
  ``compute_workflow_score``: Σ wᵢ·(Sᵢ or 0) / Σ w — an unscored stage counts 0; all five unscored
  gives 0.0; rounded to 4 decimals.
- eval_vqa/aggregate.py ``compute_workflow_score`` and eval_image_enhancement/scripts/
  compute_agentic_score.py ``compute_workflow_score``: Σ over scored stages / Σ of their weights;
  no stage scored gives 0.0; rounded to 4 decimals.
- every branch's ``compute_overall_score``: round(0.5·workflow + 0.5·task, 4) of the rounded parts.
"""

from __future__ import annotations

import pytest

from scorer.profile import load
from scorer.stages import combine

CODE = load("code-2026-04").profile
PAPER = load("paper-2026-06").profile
W = {"S1": 0.25, "S2": 0.15, "S3": 0.35, "S4": 0.15, "S5": 0.10}
ZERO_TRACKS = ("segmentation", "detection", "report")
RENORM_TRACKS = ("vqa", "enhancement")

GRID = [
    # (S1..S5, zero-as-0 value by hand, renormalised value by hand)
    ((None, None, 0.3, 0.0, 0.5), 0.35 * 0.3 + 0.10 * 0.5, (0.35 * 0.3 + 0.10 * 0.5) / 0.60),
    ((None, None, None, 1.0, 1.0), 0.25, 1.0),
    ((None, None, None, 0.75, 0.5), 0.15 * 0.75 + 0.1 * 0.5, (0.15 * 0.75 + 0.1 * 0.5) / 0.25),
    ((1.0, 1.0, 0.5, 1.0, 0.3166), 0.75666, 0.75666),  # every stage scored: both rules agree
    ((0.0, 0.0, 0.0, 0.0, 0.0), 0.0, 0.0),
    ((None, None, None, None, None), 0.0, 0.0),
    ((1.0, None, None, None, None), 0.25, 1.0),
]


def _stages(values):
    return dict(zip(("S1", "S2", "S3", "S4", "S5"), values, strict=True))


@pytest.mark.parametrize(("values", "zero", "renorm"), GRID)
@pytest.mark.parametrize("track", ZERO_TRACKS + RENORM_TRACKS)
def test_agentic_grid(track, values, zero, renorm):
    rules = CODE.stage_rules(track)
    expected = round(zero if track in ZERO_TRACKS else renorm, 4)
    out = combine(
        _stages(values),
        0.5,
        CODE.weights,
        rules.null_policy,
        all_unscored=rules.all_unscored,
        round_digits=rules.round_digits,
    )
    assert out["agentic"] == expected
    assert out["overall"] == round(0.5 * expected + 0.5 * 0.5, 4)


def test_issue_example_vqa_vs_seg():
    # Stages (None, None, 0.3, 0.0, 0.5): the VQA branch gives 0.2583, the seg branch 0.155.
    for track, want in (("vqa", 0.2583), ("enhancement", 0.2583), ("segmentation", 0.155)):
        r = CODE.stage_rules(track)
        out = combine(
            _stages((None, None, 0.3, 0.0, 0.5)),
            None,
            CODE.weights,
            r.null_policy,
            all_unscored=r.all_unscored,
            round_digits=r.round_digits,
        )
        assert out["agentic"] == want and out["overall"] is None


def test_overall_is_rounded_from_rounded_parts():
    r = CODE.stage_rules("segmentation")
    # workflow 0.155 exactly, task 0.87505 → round(0.87505, 4) = 0.8750 or 0.8751 by binary float;
    # compute_overall_score sees the rounded clinical score.
    task = 0.123456
    out = combine(
        _stages((None, None, 0.3, 0.0, 0.5)),
        task,
        CODE.weights,
        r.null_policy,
        all_unscored=r.all_unscored,
        round_digits=r.round_digits,
    )
    assert out["task"] == 0.1235
    assert out["overall"] == round(0.5 * 0.155 + 0.5 * 0.1235, 4)


def test_paper_profile_keeps_all_unscored_null_and_full_precision():
    r = PAPER.stage_rules("vqa")
    out = combine(
        _stages((None,) * 5),
        0.4,
        PAPER.weights,
        r.null_policy,
        all_unscored=r.all_unscored,
        round_digits=r.round_digits,
    )
    assert out["agentic"] is None and out["overall"] is None
    out = combine(_stages((None, None, 0.3, 0.0, 0.5)), 0.4, PAPER.weights, r.null_policy)
    assert out["agentic"] == pytest.approx((0.35 * 0.3 + 0.1 * 0.5) / 0.6, abs=1e-15)


def test_code_profile_metric_options_per_track():
    m = {t: CODE.metrics_for(t) for t in ZERO_TRACKS + RENORM_TRACKS}
    assert m["segmentation"]["completeness"] == "all_or_nothing_missing"
    assert m["segmentation"]["seg_invalid_case"] == "organ_zero_lesion_drop"
    assert m["detection"]["completeness"] == "all_or_nothing_missing"
    assert m["detection"]["det_class_set"] == "union"
    assert m["report"]["completeness"] == "all_or_nothing"
    assert m["vqa"]["completeness"] == "per_case_zero"
    e = m["enhancement"]
    assert e["completeness"] == "mean_over_valid" and e["ssim_dtype"] == "float32"
    assert e["enh_task_score"] == "psnr_ssim_lpips"
    assert e["enh_windows"]["ldct-denoising"] == {"psnr_low": 30.0, "psnr_high": 45.0, "lpips_max": 0.3}
    assert e["enh_windows"]["mri-sr"] == {"psnr_low": 20.0, "psnr_high": 35.0, "lpips_max": 0.5}
    assert CODE.codes.suppress_when_valid_and_okay and not PAPER.codes.suppress_when_valid_and_okay
