"""Grade options from profiles, and the completeness gate shared by every track."""

from __future__ import annotations

import pytest

from schemas.errors import UsageError
from scorer.grader.gate import gated_score
from scorer.grader.options import GradeOptions, options_from_table
from scorer.grader.result import CaseResult, invalid_case, missing_case
from scorer.profile import load_options


def test_defaults_follow_the_paper():
    options, name = load_options(None)
    assert name == "default" and options == GradeOptions()
    assert (options.completeness, options.seg_formula, options.ap_interpolation) == (
        "per_case_zero",
        "organ_lesion_50_50",
        "voc_all_point",
    )


@pytest.mark.parametrize("name", ["code-2026-04", "paper-2026-06"])
def test_builtin_profiles_load(name):
    options, profile = load_options(name)
    assert profile == name and isinstance(options, GradeOptions)


def test_code_profile_switches():
    options, _ = load_options("code-2026-04")
    assert options.completeness == "all_or_nothing" and options.seg_invalid_case == "organ_zero_lesion_drop"
    seg, _ = load_options("code-2026-04", "segmentation")
    assert seg.completeness == "all_or_nothing_missing"
    enh, _ = load_options("code-2026-04", "enhancement")
    assert enh.ssim_dtype == "float32" and enh.enh_windows["mri-sr"].psnr_high == 35.0


def test_profile_file_and_errors(tmp_path):
    good = tmp_path / "mine.toml"
    good.write_text(
        'extends = "paper-2026-06"\n[profile]\nname = "mine"\n[metrics]\nseg_formula = "organ_lesion_25_75"\n'
    )
    options, name = load_options(str(good))
    assert options.seg_formula == "organ_lesion_25_75" and name == "mine"
    assert options.completeness == "per_case_zero"  # the rest from the parent
    bad_value = tmp_path / "bad.toml"
    bad_value.write_text('extends = "paper-2026-06"\n[metrics]\nseg_formula = "70_30"\n')
    with pytest.raises(UsageError, match="seg_formula"):
        load_options(str(bad_value))
    broken = tmp_path / "broken.toml"
    broken.write_text("[metrics\n")
    with pytest.raises(UsageError, match="cannot read"):
        load_options(str(broken))
    not_table = tmp_path / "nt.toml"
    not_table.write_text('extends = "paper-2026-06"\nmetrics = "x"\n')
    with pytest.raises(UsageError, match="metrics"):
        load_options(str(not_table))
    with pytest.raises(UsageError, match="unknown field `nope`"):
        options_from_table({"nope": 1})


CASES = [
    CaseResult(case="a", score=1.0),
    CaseResult(case="b", score=0.5),
    missing_case("c", "c: missing"),
    invalid_case("d", "d: bad"),
]


@pytest.mark.parametrize(
    ("gate", "score"),
    [
        ("per_case_zero", 1.5 / 4),
        ("all_or_nothing", 0.0),
        ("times_completion", 0.75 * 0.5),
        ("all_or_nothing_missing", 0.0),  # c is missing
        ("mean_over_valid", 0.75),  # (1 + 0.5) / 2: c and d left out
    ],
)
def test_gate(gate, score):
    value, checks = gated_score(CASES, GradeOptions(completeness=gate))
    assert value == pytest.approx(score)
    assert checks == {
        "n_cases": 4,
        "n_scored": 2,
        "n_missing": 1,
        "n_invalid": 1,
        "completion": 0.5,
        "gate": gate,
        "gate_applied": gate != "per_case_zero",
        "gate_zeroed": gate in ("all_or_nothing", "all_or_nothing_missing"),
    }


def test_gate_missing_only():
    # An invalid case does not trip all_or_nothing_missing: it stays in the aggregate with its 0.
    present = [c for c in CASES if c.status != "missing"]
    value, checks = gated_score(present, GradeOptions(completeness="all_or_nothing_missing"))
    assert value == pytest.approx(1.5 / 3) and not checks["gate_zeroed"]
    assert gated_score(present, GradeOptions(completeness="all_or_nothing"))[0] == 0.0


def test_gate_on_complete_and_empty_sets():
    assert gated_score(CASES[:2], GradeOptions(completeness="all_or_nothing"))[0] == pytest.approx(0.75)
    assert gated_score([], GradeOptions())[0] == 0.0
    assert gated_score(CASES[2:], GradeOptions(completeness="times_completion"))[0] == 0.0
