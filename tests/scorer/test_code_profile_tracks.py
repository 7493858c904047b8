"""Each track graded under ``code-2026-04`` against hand-computed values derived from its branch.

Every expectation cites the branch file and function it comes from (AutoMedBench repository,
commits named in docs/scoring.md): eval_seg 7904145f, eval_det2d a2643b64, eval_vqa 4e189287,
eval_report_gen d86e2d2f, eval_image_enhancement 4f13d85a. The options come from the profile
(``metrics_for(track)``), so a change to the shipped profile that breaks fidelity fails here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from skimage.metrics import structural_similarity

from scorer.grader import grade
from scorer.grader.options import options_from_table
from scorer.profile import load
from tasks import synth
from tasks.registry import load_spec

CODE = load("code-2026-04").profile


def opts(track: str):
    return options_from_table(CODE.metrics_for(track))


def save(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(arr.astype(np.uint8), np.eye(4)), str(path))


# --- segmentation: eval_seg dice_scorer.score_all + aggregate.build_report ----------------------------

ORGAN = np.array([1, 1, 1, 1, 0, 0, 0, 0]).reshape(2, 2, 2)
LESION = np.array([1, 1, 0, 0, 0, 0, 0, 0]).reshape(2, 2, 2)
WRONG = np.ones((3, 2, 2))


def kidney_set(tmp: Path, n: int = 8, *, wrong=(), missing=(), noisy=False) -> tuple[Path, Path]:
    """``n`` cases with a non-empty organ and lesion; predictions perfect unless told otherwise.
    ``wrong``: (case index, "organ" | "lesion") pairs written with the wrong shape."""
    ref, sub = tmp / "private", tmp / "ws"
    for i in range(n):
        case = f"case_{i:05d}"
        save(ref / case / "organ.nii.gz", ORGAN)
        save(ref / case / "lesion.nii.gz", LESION)
        if i in missing:
            continue
        for target, arr in (("organ", ORGAN), ("lesion", LESION)):
            pred = WRONG if (i, target) in wrong else arr
            if noisy and i == 0 and target == "organ":
                pred = np.array([1, 1, 0, 0, 1, 1, 0, 0]).reshape(2, 2, 2)  # Dice 2·2/(4+4) = 0.5
            save(sub / "agents_outputs" / case / f"{target}.nii.gz", pred)
    sub.mkdir(exist_ok=True)
    return sub, ref


def test_seg_one_wrong_shape_of_eight(tmp_path):
    # score_all: the wrong-shaped organ scores dice 0.0 with an error; build_report's organ mean runs
    # over every per-patient organ_dice (7 × 1.0 + 0.0) / 8 = 0.875; the lesion mean over
    # lesion-positive, error-free patients is 7/7 = 1.0; the patient still counts as having output
    # (lesion_dice is 0.0, not None), so the gate does not fire. Clinical = 0.5·1.0 + 0.5·0.875.
    sub, ref = kidney_set(tmp_path, wrong={(3, "organ"), (3, "lesion")})
    r = grade(load_spec("kidney-seg"), sub, ref, opts("segmentation"))
    assert r.score == pytest.approx(0.5 * 1.0 + 0.5 * 0.875)
    assert r.checks["n_invalid"] == 1 and not r.checks["gate_zeroed"]
    assert r.checks["medal_metric"] == pytest.approx(1.0)  # run_eval: tier on mean lesion Dice


def test_seg_wrong_shape_lesion_only_leaves_the_lesion_mean(tmp_path):
    sub, ref = kidney_set(tmp_path, wrong={(5, "lesion")})
    r = grade(load_spec("kidney-seg"), sub, ref, opts("segmentation"))
    assert r.score == pytest.approx(1.0)  # organ 8/8, lesion 7/7


def test_seg_missing_case_zeroes_task(tmp_path):
    # build_report: inference_completes < 1 → lesion and organ Dice forced to 0.
    sub, ref = kidney_set(tmp_path, missing={2})
    r = grade(load_spec("kidney-seg"), sub, ref, opts("segmentation"))
    assert r.score == 0.0 and r.checks["gate_zeroed"]


def test_seg_empty_and_noisy(tmp_path):
    sub, ref = kidney_set(tmp_path / "p")
    assert grade(load_spec("kidney-seg"), sub, ref, opts("segmentation")).score == pytest.approx(1.0)
    sub, ref = kidney_set(tmp_path / "e", missing=set(range(8)))
    assert grade(load_spec("kidney-seg"), sub, ref, opts("segmentation")).score == 0.0
    sub, ref = kidney_set(tmp_path / "n", noisy=True)
    # organ (0.5 + 7·1)/8 = 0.9375, lesion 1.0 → 0.5·1 + 0.5·0.9375
    r = grade(load_spec("kidney-seg"), sub, ref, opts("segmentation"))
    assert r.score == pytest.approx(0.96875)


def test_feta_one_wrong_shape_of_eight(tmp_path):
    # score_all_multiclass: a shape mismatch appends 0.0 for every tissue label; per-class means over 8
    # patients are 7/8; macro mean 0.875. The patient has mean_tissue_dice 0.0 (not None), so
    # _build_report_multiclass counts it complete.
    spec = load_spec("feta-seg")
    seg = spec.seg
    assert seg is not None
    ids = [lab.id for lab in seg.labels]
    ref, sub = tmp_path / "private", tmp_path / "ws"
    label_map = np.array(ids + [0] * (8 - len(ids)))[:8].reshape(2, 2, 2)
    for i in range(8):
        case = f"sub-{i:03d}"
        save(ref / case / seg.label_file, label_map)
        save(sub / "agents_outputs" / case / seg.label_file, WRONG if i == 4 else label_map)
    r = grade(spec, sub, ref, opts("segmentation"))
    assert r.score == pytest.approx(0.875)


# --- VQA: eval_vqa vqa_scorer.score_all --------------------------------------------------------------


@pytest.fixture(scope="module")
def vqa_twin(tmp_path_factory):
    root = tmp_path_factory.mktemp("vqa")
    spec = load_spec("vqa-rad")
    synth.synth(spec, root / "data", cases=4, seed=3)
    return spec, root


def _vqa_sub(spec, root: Path, name: str) -> Path:
    ws = root / name
    synth.perfect_submission(spec, root / "data", ws)
    return ws


def test_vqa_partial_and_placeholder(vqa_twin):
    spec, root = vqa_twin
    o = opts("vqa")
    assert grade(spec, _vqa_sub(spec, root, "perfect"), root / "data" / "private", o).score == pytest.approx(
        1.0
    )
    # score_all divides by every expected question: one missing of four → 3/4 (no gate).
    ws = _vqa_sub(spec, root, "partial")
    answers = sorted((ws / spec.submission.root).glob(f"*/{spec.vqa.answer_file}"))
    answers[0].unlink()
    assert grade(spec, ws, root / "data" / "private", o).score == pytest.approx(0.75)
    # A placeholder (raw output empty while an answer is given) is not a valid output: 0 for it.
    ws = _vqa_sub(spec, root, "placeholder")
    answers = sorted((ws / spec.submission.root).glob(f"*/{spec.vqa.answer_file}"))
    rec = json.loads(answers[1].read_text())
    rec["raw_model_output"] = ""
    answers[1].write_text(json.dumps(rec))
    r = grade(spec, ws, root / "data" / "private", o)
    assert r.score == pytest.approx(0.75) and r.checks["n_invalid"] == 1
    empty = root / "empty"
    empty.mkdir(exist_ok=True)
    assert grade(spec, empty, root / "data" / "private", o).score == 0.0


# --- detection: eval_det2d det2d_scorer (class union) ------------------------------------------------


def test_det_extra_class_lowers_map(tmp_path):
    spec = load_spec("bccd-det")
    synth.synth(spec, tmp_path / "data", cases=3, seed=5)
    ws = tmp_path / "ws"
    synth.perfect_submission(spec, tmp_path / "data", ws)
    o = opts("detection")
    assert o.det_class_set == "union"
    assert grade(spec, ws, tmp_path / "data" / "private", o).score == pytest.approx(1.0)
    gt_classes = set()
    for p in (tmp_path / "data" / "private").glob("*/boxes.json"):
        gt_classes |= {b["class"].strip().lower() for b in json.loads(p.read_text())["boxes"]}
    pred = sorted((ws / spec.submission.root).glob("*/prediction.json"))[0]
    doc = json.loads(pred.read_text())
    doc["boxes"].append({"class": "Stray", "score": 0.9, "x1": 1, "y1": 1, "x2": 5, "y2": 5})
    pred.write_text(json.dumps(doc))
    # Every class named by a reference or a prediction enters the mean; "stray" has no reference box
    # and scores AP 0: mAP = K / (K + 1) with K reference classes, each still AP 1.
    k = len(gt_classes)
    assert grade(spec, ws, tmp_path / "data" / "private", o).score == pytest.approx(k / (k + 1))
    # The paper's rule (classes with reference boxes) is unchanged by the stray class.
    paper = options_from_table(load("paper-2026-06").profile.metrics_for("detection"))
    assert grade(spec, ws, tmp_path / "data" / "private", paper).score == pytest.approx(1.0)
    # build_report's gate: a missing prediction file (completion_rate < 1) zeroes TASK; a present but
    # malformed one does not trip it (score_all's completion counts files that exist).
    pred.write_text("not json")
    r = grade(spec, ws, tmp_path / "data" / "private", o)
    assert 0.0 < r.score < 1.0 and not r.checks["gate_zeroed"]
    pred.unlink()
    r = grade(spec, ws, tmp_path / "data" / "private", o)
    assert r.score == 0.0 and r.checks["gate_zeroed"]


# --- enhancement: eval_image_enhancement enhancement_scorer ------------------------------------------


@pytest.fixture(scope="module")
def ldct(tmp_path_factory):
    root = tmp_path_factory.mktemp("ldct")
    spec = load_spec("ldct-denoising")
    synth.synth(spec, root / "data", cases=3, seed=11)
    return spec, root


def _enh_sub(
    spec, root: Path, name: str, noise: float = 0.0, drop: int | None = None, wrong: int | None = None
):
    ws = root / name
    synth.perfect_submission(spec, root / "data", ws)
    rng = np.random.default_rng(1)
    for i, p in enumerate(sorted((ws / spec.submission.root).glob("*/enhanced.npy"))):
        if i == drop:
            p.unlink()
            continue
        arr = np.load(p)
        if noise:
            arr = (arr + rng.normal(0, noise, arr.shape)).astype(np.float32)
        if i == wrong:
            arr = arr[:-1]
        np.save(p, arr)
    return ws


def _branch_clinical(spec, root: Path, ws: Path, window=(30.0, 45.0)) -> float:
    """enhancement_scorer.score_all + clinical_score with LPIPS left out: float32 SSIM and PSNR per
    valid case, means over those cases, PSNR normalised into the task window, SSIM clipped."""
    import csv

    ranges = {}
    with open(root / "data" / "private" / "ground_truth.csv") as f:
        for row in csv.DictReader(f):
            ranges[row["patient_id"]] = float(row["data_range"])
    psnrs, ssims = [], []
    for ref_path in sorted((root / "data" / "private").glob("*/reference.npy")):
        case = ref_path.parent.name
        pred_path = ws / spec.submission.root / case / "enhanced.npy"
        if not pred_path.is_file():
            continue
        ref, pred = np.load(ref_path).astype(np.float32), np.load(pred_path).astype(np.float32)
        if pred.shape != ref.shape:
            continue
        dr = ranges.get(case, float(ref.max() - ref.min()))
        mse = float(np.mean((pred - ref) ** 2))
        psnrs.append(99.0 if mse <= 1e-12 else 10 * math.log10(dr**2 / mse))
        ssims.append(
            structural_similarity(
                ref, pred, data_range=dr, gaussian_weights=True, use_sample_covariance=False
            )
        )
    p = min(1.0, max(0.0, (np.mean(psnrs) - window[0]) / (window[1] - window[0])))
    s = min(1.0, max(0.0, float(np.mean(ssims))))
    return (p + s) / 2


def test_enhancement_composite_without_lpips_weights(ldct, monkeypatch):
    monkeypatch.delenv("AMB_LPIPS_WEIGHTS", raising=False)
    spec, root = ldct
    o, priv = opts("enhancement"), root / "data" / "private"
    perfect = grade(spec, _enh_sub(spec, root, "perfect"), priv, o)
    assert perfect.score == pytest.approx(1.0)  # PSNR capped at 99 dB → 1, SSIM 1
    assert perfect.degraded and perfect.degraded[0].startswith("LPIPS: not computed")
    variants: list[tuple[str, dict[str, Any]]] = [
        ("noisy", dict(noise=20.0)),
        ("partial", dict(noise=20.0, drop=1)),
        ("wrong", dict(noise=20.0, wrong=2)),
    ]
    for name, kw in variants:
        ws = _enh_sub(spec, root, name, **kw)
        r = grade(spec, ws, priv, o)
        # No gate: the means run over the cases with a valid output (score_all's NaN filter).
        assert r.score == pytest.approx(_branch_clinical(spec, root, ws), abs=1e-9), name
        assert 0.0 < r.score < 1.0
    empty = root / "empty"
    empty.mkdir(exist_ok=True)
    assert grade(spec, empty, priv, o).score == 0.0


def test_enhancement_values_overflowing_float32_are_invalid(ldct, monkeypatch):
    # The profile computes SSIM and PSNR in float32: 1e20 is a float32, its square is not.
    monkeypatch.delenv("AMB_LPIPS_WEIGHTS", raising=False)
    spec, root = ldct
    ws = _enh_sub(spec, root, "overflow")
    outputs = sorted((ws / spec.submission.root).glob("*/enhanced.npy"))
    big = np.load(outputs[0])
    big[0, 0] = 1e20
    np.save(outputs[0], big)
    wide = np.load(outputs[1]).astype(np.float64)
    wide[0, 0] = 1e39  # beyond float32 altogether: refused by its dtype before any value is read
    np.save(outputs[1], wide)
    r = grade(spec, ws, root / "data" / "private", opts("enhancement"))  # RuntimeWarnings are errors here
    first, second, third = r.cases
    assert first.status == "invalid" and first.reason == (
        "agents_outputs/case_00000/enhanced.npy: enhanced.npy has values too large for SSIM and PSNR "
        "in float32 (largest magnitude 1e+20)"
    )
    assert second.status == "invalid" and "has dtype float64, expected float32" in (second.reason or "")
    assert third.status == "scored" and r.score == pytest.approx(1.0)  # the valid case's mean


def test_enhancement_ssim_float32_differs_from_float64(ldct):
    spec, root = ldct
    ws = _enh_sub(spec, root, "noisy32", noise=20.0)
    o32 = options_from_table({"ssim_dtype": "float32"})
    r32 = grade(spec, ws, root / "data" / "private", o32)
    r64 = grade(spec, ws, root / "data" / "private", options_from_table({}))
    d = [abs(a.details["ssim"] - b.details["ssim"]) for a, b in zip(r32.cases, r64.cases, strict=True)]
    assert max(d) < 1e-3 and r32.params["ssim_dtype"] == "float32"


# --- report generation: eval_report_gen aggregate.build_report ---------------------------------------


def test_report_partial_or_invalid_is_zero():
    # build_report: all_cases_done = completion_rate >= 1 and output_format_valid; otherwise every
    # clinical component is forced to 0. (The report grader's use of the gate on real reports is in
    # test_grader_report.py; grading reports here would cost a minute of metric start-up.)
    from scorer.grader.gate import gated_score
    from scorer.grader.result import CaseResult, invalid_case, missing_case

    o = opts("report")
    ok = [CaseResult(case=f"c{i}", score=0.6) for i in range(3)]
    assert gated_score(ok, o)[0] == pytest.approx(0.6)
    assert gated_score([*ok[:2], missing_case("c2", "missing")], o)[0] == 0.0
    assert gated_score([*ok[:2], invalid_case("c2", "too short")], o)[0] == 0.0
