"""Stage combination: the paper's worked example (Appendix I), null policies, rubric rules."""

from __future__ import annotations

import pytest

from scorer.judge.base import Verdict
from scorer.profile import load
from scorer.stages import agentic, combine, item_scores, judged_stages
from tests.fakes.events import unsigned_events


def test_paper_worked_example_appendix_i():
    # Opus 4.6, kidney, Lite: S1 1.0, S2 1.0, S3 0.5, S4 1.0, S5 0.3166; organ Dice 0.9160 and lesion
    # Dice 0.1045 under the earlier seg formula 0.25·organ + 0.75·lesion.
    p = load("paper-2026-06").profile
    organ, lesion = 0.9160, 0.1045
    task = 0.25 * organ + 0.75 * lesion
    out = combine(
        {"S1": 1.0, "S2": 1.0, "S3": 0.5, "S4": 1.0, "S5": 0.3166}, task, p.weights, p.stages.null_policy
    )
    # The paper prints 4 decimals of values that were themselves rounded to 4 decimals (0.25·0.9160
    # + 0.75·0.1045 = 0.307375), so agreement is to within one unit in the 4th decimal.
    assert out["agentic"] == pytest.approx(0.7567, abs=1e-4)
    assert out["task"] == pytest.approx(0.3073, abs=1e-4)
    assert out["overall"] == pytest.approx(0.5320, abs=1e-4)


def test_worked_example_with_the_grader_formula():
    # The same TASK through the grader's own seg formula switch (organ_lesion_25_75) on real masks:
    # one case, organ |P|=|G|=1000 with 916 shared voxels (Dice 0.916), lesion |P|=|G|=2000 with
    # 209 shared (Dice 0.1045).
    np = pytest.importorskip("numpy")
    import nibabel as nib

    from scorer.grader import grade
    from scorer.grader.options import GradeOptions
    from tasks.registry import load_spec

    spec = load_spec("kidney-seg")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shape = (40, 40, 10)

        def mask(indices):
            m = np.zeros(int(np.prod(shape)), dtype=np.uint8)
            m[list(indices)] = 1
            return m.reshape(shape)

        ref_organ, pred_organ = mask(range(0, 1000)), mask(range(84, 1084))
        ref_lesion, pred_lesion = mask(range(2000, 4000)), mask(range(3791, 5791))
        for side, organ, lesion in (
            ("private/case_00000", ref_organ, ref_lesion),
            ("sub/agents_outputs/case_00000", pred_organ, pred_lesion),
        ):
            d = root / side
            d.mkdir(parents=True)
            nib.save(nib.Nifti1Image(organ, np.eye(4)), d / "organ.nii.gz")
            nib.save(nib.Nifti1Image(lesion, np.eye(4)), d / "lesion.nii.gz")
        (root / "public/case_00000").mkdir(parents=True)
        nib.save(nib.Nifti1Image(np.zeros(shape, np.int16), np.eye(4)), root / "public/case_00000/ct.nii.gz")
        result = grade(spec, root / "sub", root / "private", GradeOptions(seg_formula="organ_lesion_25_75"))
    assert result.score == pytest.approx(0.3073, abs=1e-4)
    p = load("paper-2026-06").profile
    out = combine(
        {"S1": 1.0, "S2": 1.0, "S3": 0.5, "S4": 1.0, "S5": 0.3166}, result.score, p.weights, "renormalise"
    )
    assert out["agentic"] == pytest.approx(0.7567, abs=1e-4)
    assert out["overall"] == pytest.approx(0.5320, abs=1e-4)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("zero", 0.25 + 0.15 + 0.35), ("renormalise", 1.0), ("unscored", None)],
    ids=["zero-counts-0", "renormalise-drops", "unscored-propagates"],
)
def test_null_policies(policy, expected):
    w = load("paper-2026-06").profile.weights
    value, _ = agentic({"S1": 1.0, "S2": 1.0, "S3": 1.0, "S4": None, "S5": None}, w, policy)
    assert value == (pytest.approx(expected) if expected is not None else None)


def test_no_stage_scored_is_unscored_not_zero():
    w = load("paper-2026-06").profile.weights
    value, reason = agentic({s: None for s in ("S1", "S2", "S3", "S4", "S5")}, w, "zero")
    assert value is None and "no stage" in (reason or "")
    assert combine({"S1": 1.0}, None, w, "renormalise")["overall"] is None


def test_auto_credit_requires_and_unscored_items():
    p = load("paper-2026-06").profile
    items = p.items_for("segmentation", "lite")
    verdicts = {i.id: Verdict(item=i.id, value=1.0, judge="t") for i in items}
    verdicts["s1a"] = Verdict(item="s1a", value=0.0, judge="t")
    scores = {s.id: s for s in item_scores(items, verdicts, "lite")}
    assert scores["s1b"].value == 0.0 and scores["s1b"].source == "requires:s1a"
    assert scores["s1d"].source == "auto_credit" and scores["s1d"].value == 1.0
    verdicts["s3"] = Verdict(item="s3", value=None, judge="t", unscored_reason="parse_failure")
    stages = judged_stages(item_scores(items, verdicts, "lite"), p.stages)
    assert stages["S3"][0] is None and "parse_failure" in (stages["S3"][1] or "")
    assert stages["S1"][0] == pytest.approx(3 / 6)  # s1a, s1b, s1c are 0; s1d-s1f credited
    # Standard tier: s1d-s1f are judged, not credited.
    std = {s.id: s for s in item_scores(p.items_for("segmentation", "standard"), verdicts, "standard")}
    assert std["s1d"].source == "judge"


def test_track_variants_replace_the_default_item():
    p = load("paper-2026-06").profile
    det = {i.id: i for i in p.items_for("detection", "lite")}
    seg = {i.id: i for i in p.items_for("segmentation", "lite")}
    assert "boxes" in det["s1c"].text and "tumour" in seg["s1c"].text
    assert len(det) == len(seg) == 12


def test_report_track_has_its_own_rubric():
    p = load("paper-2026-06").profile
    from collections import Counter

    lite = Counter(i.stage for i in p.items_for("report", "lite"))
    std = Counter(i.stage for i in p.items_for("report", "standard"))
    assert (lite["S1"], lite["S2"], lite["S3"]) == (
        8,
        7,
        7,
    )  # Standard-only checks leave the Lite denominator
    assert (std["S1"], std["S2"], std["S3"]) == (11, 7, 7)
    assert "s1b" not in {i.id for i in p.items_for("report", "lite")}
    enh = {i.id: i for i in p.items_for("enhancement", "lite")}
    assert enh["s3"].values == [0, 0.2, 0.5, 1]


def test_pattern_rules_of_the_offline_judge():
    from schemas.blob import BlobRef, digest
    from schemas.events import FileWritten, RunStarted
    from scorer.judge.offline import OfflineJudge
    from scorer.trajectory import fold

    plan = (
        b"# Plan\n1. read manifest.json\n2. run pilot on one study\n3. write "
        b"agent_outputs/<case>/report.txt\n"
    )
    payloads = [
        RunStarted(task="mimic-cxr-report", tier="lite"),
        FileWritten(
            path="plan/plan.md",
            size=len(plan),
            sha256=digest(plan),
            content=BlobRef(blob=digest(plan), size=len(plan)),
        ),
    ]
    evs = unsigned_events("r", "shim", payloads)
    get = {digest(plan): plan}.__getitem__
    traj = fold("r", evs, lambda ref: get(ref.blob))
    items = {i.id: i for i in load("paper-2026-06").profile.items_for("report", "lite")}
    judge = OfflineJudge(lambda ref: get(ref.blob))
    # The offline judge reads the trajectory, never the evidence view: none is built here.
    out = judge.judge(traj, None, list(items.values()), track="report")  # type: ignore[arg-type]
    assert out["r1_manifest"].value == 1.0 and out["r1_outpath"].value == 1.0 and out["r1_pilot"].value == 1.0
    assert out["r2_manifest"].value == 0.0 and out["r3_rerun"].value == 1.0
