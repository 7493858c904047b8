"""Medal tier (good / okay / fail) and rating (A / B / C / F) of a graded run, per track.

The rules are the branches' ``medal_tier.assign_tier`` and ``aggregate.assign_rating`` (docs/scoring.md
names the commit and function of each), parameterised by the profile's ``[medals.<track>]``. A run
without a grade has neither (None, with the reason); a rule violation is rated F.
"""

from __future__ import annotations

import msgspec

from schemas.score_row import Medal, Rating
from scorer.profile import MedalRules
from scorer.row import Grade


class MedalResult(msgspec.Struct, frozen=True, kw_only=True):
    medal: Medal | None
    rating: Rating | None
    valid: bool
    """The submission passed the track's validity rule (what the code-suppression rule reads)."""
    reason: str | None = None


def medal_of(value: float, rules: MedalRules) -> Medal:
    if value >= rules.good:
        return "good"
    if value >= rules.okay:
        return "okay"
    return "fail"


_BAND_LEVELS: tuple[tuple[Rating, Medal], ...] = (("A", "good"), ("B", "okay"), ("C", "fail"))
_LETTER: dict[str, Rating] = {"good": "A", "okay": "B", "fail": "C"}


def assess(grade: Grade, task: str | None, rules: MedalRules | None, *, breach: bool = False) -> MedalResult:
    if breach:
        return MedalResult(medal="fail", rating="F", valid=False, reason="rule violation")
    if rules is None:
        return MedalResult(medal=None, rating=None, valid=False, reason="no medal rules for this track")
    if not grade.scored or grade.task_score is None:
        return MedalResult(medal=None, rating=None, valid=False, reason=f"no grade: {grade.reason}")
    if rules.rating == "bands":
        return _bands(grade, task, rules)
    value = grade.task_score
    if rules.on == "primary" and grade.medal_metric is not None:
        value = grade.medal_metric
    medal: Medal = "fail" if grade.gate_zeroed else medal_of(value, rules)
    n = max(grade.n_cases, 1)
    if rules.rating == "medal_coverage":
        present = (grade.n_cases - grade.n_missing) / n
        valid = grade.n_valid > 0 and grade.n_valid / n >= 0.5 and present >= 0.5
        why = None if valid else f"{grade.n_valid}/{grade.n_cases} valid answers, {present:.0%} present"
    else:
        valid = grade.complete_and_valid
        why = None if valid else f"{grade.n_missing} missing and {grade.n_invalid} invalid cases"
    return MedalResult(medal=medal, rating=_LETTER[medal] if valid else "F", valid=valid, reason=why)


def _bands(grade: Grade, task: str | None, rules: MedalRules) -> MedalResult:
    n = max(grade.n_cases, 1)
    if not grade.complete_and_valid or grade.n_valid / n < 0.5:
        why = f"{grade.n_missing} missing and {grade.n_invalid} invalid cases"
        return MedalResult(medal="fail", rating="F", valid=False, reason=why)
    bands = rules.bands.get(task or "")
    if bands is None:
        return MedalResult(medal=None, rating=None, valid=True, reason=f"no rating bands for task {task}")
    psnr, ssim = grade.mean_psnr_db, grade.mean_ssim_raw
    if psnr is None or ssim is None:
        return MedalResult(medal="fail", rating="F", valid=True, reason="no mean PSNR/SSIM in the grade")
    for level, medal in _BAND_LEVELS:
        band = bands.get(level)
        if band is not None and psnr >= band.psnr_min and ssim >= band.ssim_min:
            return MedalResult(medal=medal, rating=level, valid=True)
    return MedalResult(
        medal="fail", rating="F", valid=True, reason=f"below band C (PSNR {psnr:.2f}, SSIM {ssim:.4f})"
    )
