"""The segmentation grader on hand-built references: every convention and edge case, with
hand-computed scores."""

from __future__ import annotations

import gzip
import struct
import tracemalloc
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from replay.arrays import MAX_VOXEL_OFFSET
from scorer.grader import grade
from scorer.grader.options import GradeOptions
from scorer.grader.result import BadReference
from tasks.registry import load_spec

KIDNEY = load_spec("kidney-seg")
FETA = load_spec("feta-seg")
OAR = load_spec("pancreas-oar-seg")


def save(path: Path, data, dtype=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.asarray(data)
    if dtype is None:  # uint8 for small non-negative integers, float32 for anything else
        integral = (
            np.isfinite(data).all() and (data == np.rint(data)).all() and data.min() >= 0 and data.max() < 256
        )
        dtype = np.uint8 if integral else np.float32
    arr = data.astype(dtype)
    if arr.ndim == 1:
        arr = arr.reshape(2, 2, -1)
    nib.save(nib.Nifti1Image(arr, np.diag([0.8, 0.8, 2.5, 1.0])), str(path))
    return path


def v(*values):
    """An 8-voxel volume (2×2×2) from a flat list."""
    return np.array(values, dtype=np.float64)


# Organ/lesion fixtures over 8 voxels (see test_formulas for the hand computation).
CASES = {
    # organ: tp 2, |P| 4, |G| 4 → 0.5; lesion: tp 1, |P| 1, |G| 2 → 2/3
    "A": dict(
        organ_ref=v(1, 1, 1, 1, 0, 0, 0, 0),
        organ=v(1, 1, 0, 0, 1, 1, 0, 0),
        lesion_ref=v(1, 1, 0, 0, 0, 0, 0, 0),
        lesion=v(1, 0, 0, 0, 0, 0, 0, 0),
    ),
    # organ perfect → 1; lesion empty in both → not counted (or 1 under per_case_macro)
    "B": dict(
        organ_ref=v(0, 0, 0, 0, 1, 1, 1, 1),
        organ=v(0, 0, 0, 0, 1, 1, 1, 1),
        lesion_ref=v(0, 0, 0, 0, 0, 0, 0, 0),
        lesion=v(0, 0, 0, 0, 0, 0, 0, 0),
    ),
    # organ predicted empty → 0 (one empty); lesion misses → 0
    "C": dict(
        organ_ref=v(1, 1, 0, 0, 0, 0, 0, 0),
        organ=v(0, 0, 0, 0, 0, 0, 0, 0),
        lesion_ref=v(1, 0, 0, 0, 0, 0, 0, 0),
        lesion=v(0, 1, 0, 0, 0, 0, 0, 0),
    ),
}


def binary_set(tmp_path: Path, cases=CASES, root="agents_outputs") -> tuple[Path, Path]:
    ref, sub = tmp_path / "private", tmp_path / "ws"
    for case, d in cases.items():
        save(ref / case / "organ.nii.gz", d["organ_ref"])
        save(ref / case / "lesion.nii.gz", d["lesion_ref"])
        if d.get("organ") is not None:
            save(sub / root / case / "organ.nii.gz", d["organ"])
        if d.get("lesion") is not None:
            save(sub / root / case / "lesion.nii.gz", d["lesion"])
    sub.mkdir(exist_ok=True)
    return sub, ref


@pytest.mark.parametrize(
    ("formula", "expected"),
    [
        # organ mean (0.5 + 1 + 0)/3 = 0.5; lesion mean over lesion-positive A, C = (2/3 + 0)/2 = 1/3
        ("organ_lesion_50_50", 0.5 * 0.5 + 0.5 * (1 / 3)),
        ("organ_lesion_25_75", 0.25 * 0.5 + 0.75 * (1 / 3)),
        # per case: A (0.5 + 2/3)/2, B (1 + 1)/2, C 0 → mean
        ("per_case_macro", ((0.5 + 2 / 3) / 2 + 1.0 + 0.0) / 3),
    ],
)
def test_formulas(tmp_path, formula, expected):
    sub, ref = binary_set(tmp_path)
    r = grade(KIDNEY, sub, ref, GradeOptions(seg_formula=formula))
    assert r.score == pytest.approx(expected)
    assert r.params["seg_formula"] == formula
    by_case = {c.case: c for c in r.cases}
    assert by_case["A"].details["dice"] == pytest.approx({"organ": 0.5, "lesion": 2 / 3})
    assert by_case["B"].details["dice"] == pytest.approx({"organ": 1.0, "lesion": 1.0})
    assert by_case["C"].details["dice"] == pytest.approx({"organ": 0.0, "lesion": 0.0})
    assert r.checks["lesion_positive_cases"] == 2
    assert all(c.status == "scored" and c.reason is None for c in r.cases)


def test_false_positive_lesion_on_a_lesion_free_case(tmp_path):
    # The public code averages lesion Dice over lesion-positive cases only, so a spurious lesion
    # on a lesion-free case costs nothing there; under the paper's per-case macro it scores 0.
    cases = {"B": dict(CASES["B"], lesion=v(0, 0, 0, 0, 1, 0, 0, 0))}
    sub, ref = binary_set(tmp_path, cases)
    assert grade(KIDNEY, sub, ref, GradeOptions()).score == pytest.approx(1.0)
    assert grade(KIDNEY, sub, ref, GradeOptions(seg_formula="per_case_macro")).score == pytest.approx(0.5)


def test_no_lesion_positive_case_renormalises_to_organ(tmp_path):
    sub, ref = binary_set(tmp_path, {"B": CASES["B"]})
    r = grade(KIDNEY, sub, ref, GradeOptions())
    assert r.score == pytest.approx(1.0) and r.checks["lesion_positive_cases"] == 0


def test_binarisation_of_float_probabilities(tmp_path):
    cases = {"A": dict(CASES["A"], organ=v(0.9, 0.51, 0.5, 0.2, 0.7, 0.6, 0, 0))}
    sub, ref = binary_set(tmp_path, cases)
    # > 0.5 keeps voxels 0, 1, 4, 5: same as the integer fixture → organ 0.5
    r = grade(KIDNEY, sub, ref, GradeOptions())
    assert r.cases[0].details["dice"]["organ"] == pytest.approx(0.5)


def test_values_outside_unit_range_are_binarised_with_a_warning(tmp_path):
    cases = {"A": dict(CASES["A"], organ=v(2, 2, 0, 0, 2, 2, 0, 0))}
    sub, ref = binary_set(tmp_path, cases)
    c = grade(KIDNEY, sub, ref, GradeOptions()).cases[0]
    assert c.details["dice"]["organ"] == pytest.approx(0.5)
    assert "outside [0, 1]" in c.details["warnings"][0]


def test_alias_file_names_are_accepted(tmp_path):
    sub, ref = binary_set(tmp_path, {"A": CASES["A"]})
    case_dir = sub / "agents_outputs" / "A"
    (case_dir / "organ.nii.gz").rename(case_dir / "kidney.nii.gz")
    (case_dir / "lesion.nii.gz").rename(case_dir / "kidney_lesion.nii.gz")
    assert grade(KIDNEY, sub, ref, GradeOptions()).cases[0].details["dice"]["organ"] == pytest.approx(0.5)


def test_missing_file_scores_zero_with_reason(tmp_path):
    cases = dict(CASES)
    cases["B"] = dict(CASES["B"], lesion=None)
    sub, ref = binary_set(tmp_path, cases)
    r = grade(KIDNEY, sub, ref, GradeOptions())
    b = next(c for c in r.cases if c.case == "B")
    assert (b.score, b.status) == (0.0, "missing")
    assert b.reason == "agents_outputs/B/lesion.nii.gz: missing"
    # organ mean (0.5 + 0 + 0)/3; lesion unchanged (B is lesion-free, so it adds nothing)
    assert r.score == pytest.approx(0.5 * (0.5 / 3) + 0.5 * (1 / 3))
    assert r.checks["n_missing"] == 1


@pytest.mark.parametrize(
    ("gate", "expected"),
    [
        ("per_case_zero", 0.5 * (0.5 / 3) + 0.5 * (1 / 3)),
        ("all_or_nothing", 0.0),
        # A and C only: organ (0.5 + 0)/2, lesion (2/3 + 0)/2 → × completion 2/3
        ("times_completion", (0.5 * 0.25 + 0.5 * (1 / 3)) * 2 / 3),
    ],
)
def test_completeness_gate(tmp_path, gate, expected):
    cases = dict(CASES)
    cases["B"] = dict(CASES["B"], organ=None, lesion=None)
    sub, ref = binary_set(tmp_path, cases)
    r = grade(KIDNEY, sub, ref, GradeOptions(completeness=gate))
    assert r.score == pytest.approx(expected)
    assert r.checks["completion"] == pytest.approx(2 / 3)
    assert r.checks["gate"] == gate


def test_shape_mismatch_zero_or_dropped(tmp_path):
    sub, ref = binary_set(tmp_path)
    save(sub / "agents_outputs" / "C" / "organ.nii.gz", np.zeros((2, 2, 3)))
    r = grade(KIDNEY, sub, ref, GradeOptions())
    c = next(c for c in r.cases if c.case == "C")
    assert c.status == "invalid" and "shape 2×2×3 does not match the reference 2×2×2" in (c.reason or "")
    dropped = grade(KIDNEY, sub, ref, GradeOptions(seg_invalid_case="drop"))
    # C dropped from both means: organ (0.5 + 1)/2, lesion over A only 2/3
    assert dropped.score == pytest.approx(0.5 * 0.75 + 0.5 * (2 / 3))
    assert dropped.checks["dropped"] == 1


def test_corrupt_inputs_are_invalid_with_reasons(tmp_path):
    cases = {k: CASES["A"] for k in ("nan", "gzip", "truncated", "text", "rgb", "empty")}
    sub, ref = binary_set(tmp_path, cases)
    out = sub / "agents_outputs"
    save(out / "nan" / "organ.nii.gz", v(np.nan, 1, 0, 0, 0, 0, 0, 0), np.float32)
    (out / "gzip" / "organ.nii.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
    raw = gzip.decompress((out / "truncated" / "organ.nii.gz").read_bytes())
    (out / "truncated" / "organ.nii.gz").write_bytes(gzip.compress(raw[: len(raw) - 5]))
    (out / "text" / "organ.nii.gz").write_text("this is not a NIfTI file")
    rgb = np.zeros((2, 2, 2), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    (out / "rgb" / "organ.nii.gz").unlink()
    nib.save(nib.Nifti1Image(rgb, np.eye(4)), str(out / "rgb" / "organ.nii.gz"))
    (out / "empty" / "organ.nii.gz").write_bytes(b"")
    r = grade(KIDNEY, sub, ref, GradeOptions())
    reasons = {c.case: c.reason for c in r.cases}
    assert all(c.status == "invalid" and c.score == 0.0 for c in r.cases), reasons
    assert "NaN" in (reasons["nan"] or "")
    assert "unsupported voxel type" in (reasons["rgb"] or "")
    for case in ("gzip", "truncated", "text", "empty"):
        assert str(reasons[case]).startswith(f"agents_outputs/{case}/organ.nii.gz: "), reasons[case]


def hostile_header(path: Path, vox_offset: float, extension_size: int | None = None) -> None:
    """Rewrite the NIfTI-1 file at ``path``: its vox_offset, and one header extension claiming
    ``extension_size`` bytes (gzip-compressed, as a GzipFile allocates what one read asks for)."""
    raw = bytearray(gzip.decompress(path.read_bytes()))
    struct.pack_into("<f", raw, 108, vox_offset)
    if extension_size is not None:
        raw[348:352] = b"\x01\x00\x00\x00"  # "extensions follow"
        raw[352:352] = struct.pack("<ii", extension_size, 0)
    path.write_bytes(gzip.compress(bytes(raw)))


def test_a_header_or_extension_claiming_gigabytes_is_invalid_and_read_within_bounds(tmp_path):
    sub, ref = binary_set(tmp_path, {"far": CASES["A"], "ext": CASES["A"]})
    out = sub / "agents_outputs"
    hostile_header(out / "far" / "organ.nii.gz", 1e12)
    hostile_header(out / "ext" / "organ.nii.gz", 4096, extension_size=2**31 - 16)
    tracemalloc.start()
    try:
        r = grade(KIDNEY, sub, ref, GradeOptions())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    reasons = {c.case: c.reason for c in r.cases}
    assert all(c.status == "invalid" for c in r.cases), reasons
    assert f"past the {MAX_VOXEL_OFFSET} bytes a header and its extensions may take" in str(reasons["far"])
    assert "failed to read extension content" in str(reasons["ext"])
    assert peak < MAX_VOXEL_OFFSET, peak  # not the 2 GiB the extension claims


def test_directory_or_fifo_instead_of_a_file(tmp_path):
    import os

    sub, ref = binary_set(tmp_path, {"d": dict(CASES["A"], organ=None), "f": dict(CASES["A"], organ=None)})
    (sub / "agents_outputs" / "d" / "organ.nii.gz").mkdir()
    os.mkfifo(sub / "agents_outputs" / "f" / "organ.nii.gz")  # opening it would block forever
    r = grade(KIDNEY, sub, ref, GradeOptions())
    assert [(c.status, c.reason) for c in r.cases] == [
        ("invalid", "agents_outputs/d/organ.nii.gz: not a regular file (a directory)"),
        ("invalid", "agents_outputs/f/organ.nii.gz: not a regular file (a FIFO)"),
    ]


def test_submission_without_outputs_folder(tmp_path):
    sub, ref = binary_set(tmp_path, {"A": dict(CASES["A"], organ=None, lesion=None)})
    r = grade(KIDNEY, sub, ref, GradeOptions())
    assert r.score == 0.0 and r.cases[0].reason == "agents_outputs/A/organ.nii.gz: missing"


def test_broken_reference_is_an_error_not_a_zero(tmp_path):
    sub, ref = binary_set(tmp_path, {"A": CASES["A"]})
    (ref / "A" / "organ.nii.gz").write_bytes(b"junk")
    with pytest.raises(BadReference, match="organ.nii.gz"):
        grade(KIDNEY, sub, ref, GradeOptions())
    with pytest.raises(BadReference, match="no case folders"):
        (tmp_path / "emptyref").mkdir()
        grade(KIDNEY, sub, tmp_path / "emptyref", GradeOptions())


# --- multiclass --------------------------------------------------------------------------------------


def multiclass_set(tmp_path, pairs, spec=FETA):
    ref, sub = tmp_path / "private", tmp_path / "ws"
    for case, (r, p, *dtype) in pairs.items():
        save(ref / case / "dseg.nii.gz", r)
        if p is not None:
            save(sub / "agents_outputs" / case / "dseg.nii.gz", p, *(dtype or [np.uint8]))
    sub.mkdir(exist_ok=True)
    return sub, ref


REF8 = v(1, 1, 2, 2, 0, 0, 0, 0)
PRED8 = v(1, 2, 2, 2, 3, 0, 0, 0)


def test_multiclass_hand_computed(tmp_path):
    # label 1: 2/3, label 2: 4/5, label 3: predicted only → 0, labels 4..7 both empty → 1
    sub, ref = multiclass_set(tmp_path, {"x": (REF8, PRED8)})
    r = grade(FETA, sub, ref, GradeOptions())
    assert r.cases[0].details["dice"] == pytest.approx(
        {"1": 2 / 3, "2": 0.8, "3": 0.0, "4": 1.0, "5": 1.0, "6": 1.0, "7": 1.0}
    )
    assert r.score == pytest.approx((2 / 3 + 0.8 + 0 + 4) / 7)
    skip = grade(FETA, sub, ref, GradeOptions(seg_multiclass_empty="skip_gt_empty"))
    assert skip.score == pytest.approx((2 / 3 + 0.8) / 2)
    assert skip.cases[0].details["counted"] == ["1", "2"]


def test_multiclass_macro_is_over_labels_not_cases(tmp_path):
    # Case x holds labels 1 and 2, case y only label 1; skip_gt_empty makes the two orders differ:
    # label 1 mean over x, y = (2/3 + 1)/2; label 2 over x only = 0.8 → macro (5/6 + 0.8)/2.
    y_ref = v(1, 0, 0, 0, 0, 0, 0, 0)
    sub, ref = multiclass_set(tmp_path, {"x": (REF8, PRED8), "y": (y_ref, y_ref)})
    r = grade(FETA, sub, ref, GradeOptions(seg_multiclass_empty="skip_gt_empty"))
    assert r.score == pytest.approx(((2 / 3 + 1) / 2 + 0.8) / 2)


def test_multiclass_float_maps_are_rounded(tmp_path):
    sub, ref = multiclass_set(tmp_path, {"x": (REF8, PRED8 + 0.3, np.float32)})
    assert grade(FETA, sub, ref, GradeOptions()).score == pytest.approx((2 / 3 + 0.8 + 0 + 4) / 7)


@pytest.mark.parametrize(
    ("pred", "dtype", "needle"),
    [
        (v(1, 1, 2, 2, 0, 0, 0, 8), np.uint8, "label 8 is not allowed"),
        (v(1, 1, 2, 2, 0, 0, 0, -1), np.int16, "label -1 is not allowed"),
        (v(1, 1, 2, 2, 0, 0, 0, 70000), np.int32, "label 70000 is not allowed"),
    ],
)
def test_multiclass_out_of_range_labels(tmp_path, pred, dtype, needle):
    sub, ref = multiclass_set(tmp_path, {"x": (REF8, pred, dtype)})
    c = grade(FETA, sub, ref, GradeOptions()).cases[0]
    assert c.status == "invalid" and needle in (c.reason or "")


def test_multiclass_gaps_in_allowed_ids(tmp_path):
    # pancreas-oar allows 1-4, 6, 8-17, 22-26, 28: 5 and 7 lie inside the range but are not allowed.
    sub, ref = multiclass_set(tmp_path, {"x": (v(1, 2, 0, 0, 0, 0, 0, 0), v(1, 2, 5, 7, 0, 0, 0, 0))}, OAR)
    c = grade(OAR, sub, ref, GradeOptions()).cases[0]
    assert c.reason is not None
    assert c.status == "invalid" and c.reason.endswith("labels not allowed: 5, 7")


def test_multiclass_missing_case_counts_zero_for_every_label(tmp_path):
    sub, ref = multiclass_set(tmp_path, {"x": (REF8, REF8), "y": (REF8, None)})
    r = grade(FETA, sub, ref, GradeOptions())
    assert r.score == pytest.approx(0.5)
    skip = grade(FETA, sub, ref, GradeOptions(seg_multiclass_empty="skip_gt_empty"))
    y = next(c for c in skip.cases if c.case == "y")
    assert y.details["counted"] == ["1", "2"] and skip.score == pytest.approx(0.5)
