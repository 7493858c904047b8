"""Enhancement grader: perfect/empty twins, every malformed-output reason, the data-range rule, gates."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.task_spec import TaskError
from scorer.grader import grade
from scorer.grader.options import GradeOptions
from tasks.registry import load_spec
from tasks.synth import perfect_submission
from tests.scorer.helpers import output_file

TASKS = ["ldct-denoising", "mri-sr"]


@pytest.fixture(scope="module", params=TASKS)
def twin(request, make_twin):
    return load_spec(request.param), make_twin(request.param, 3, 11)


def out_path(ws: Path, case: str) -> Path:
    return output_file(ws, case, "enhanced.npy")


def test_perfect_scores_one_and_empty_scores_zero(twin, tmp_path):
    spec, data = twin
    perfect_submission(spec, data, tmp_path / "good")
    r = grade(spec, tmp_path / "good", data / "private")
    assert r.score == 1.0 and all(c.score == 1.0 and c.reason is None for c in r.cases)
    assert r.params["ssim"]["sigma"] == 1.5 and r.checks["mean_psnr_db"] == 99.0
    (tmp_path / "empty").mkdir()
    r = grade(spec, tmp_path / "empty", data / "private")
    assert r.score == 0.0 and len(r.cases) == 3
    assert all(c.status == "missing" and "enhanced.npy is missing" in (c.reason or "") for c in r.cases)


def test_identity_baseline_is_between(twin, tmp_path):
    spec, data = twin
    for case in ("case_00000", "case_00001", "case_00002"):
        x = np.load(data / "public" / case / "input.npy")
        if spec.enh.scale == 2:
            x = np.kron(x, np.ones((2, 2), np.float32))
        np.save(out_path(tmp_path, case), x)
    r = grade(spec, tmp_path, data / "private")
    assert 0.3 < r.score < 0.99
    assert all(c.details["data_range_source"] == "ground_truth.csv" for c in r.cases)


def _bad_outputs(shape):
    good = np.zeros(shape, np.float32)
    nan = good.copy()
    nan[0, 0] = np.nan
    inf = good.copy()
    inf[1, 1] = np.inf
    npz = io.BytesIO()
    np.savez(npz, a=good)
    obj = io.BytesIO()
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    huge = io.BytesIO()
    np.save(huge, np.zeros((2, 2), np.float32))
    claims = io.BytesIO()  # a valid header claiming a 40 GB array over 16 bytes of data
    np.lib.format.write_array_header_1_0(
        claims, {"descr": "<f4", "fortran_order": False, "shape": (100_000, 100_000)}
    )
    header_claims_huge = claims.getvalue() + bytes(16)
    return {
        "shape": (np.zeros((shape[0] + 1, shape[1]), np.float32), "shape"),
        "3d": (good[None], "shape"),
        "float64": (good.astype(np.float64), "dtype float64"),
        "int16": (good.astype(np.int16), "dtype int16"),
        "nan": (nan, "1 NaN"),
        "inf": (inf, "1 Inf"),
        "garbage": (b"\x00\xffnot an array", "not a readable .npy"),
        "empty-file": (b"", "not a readable .npy"),
        "pickle": (obj.getvalue(), "not a readable .npy"),
        "npz": (npz.getvalue(), ".npz"),
        "truncated": (huge.getvalue()[:-5], "not a readable .npy"),
        "huge-header": (header_claims_huge, "not a readable .npy"),
    }


@pytest.mark.parametrize("kind", list(_bad_outputs((4, 4))))
def test_each_malformed_output_scores_zero_with_its_reason(twin, tmp_path, kind):
    spec, data = twin
    perfect_submission(spec, data, tmp_path)
    shape = tuple(np.load(data / "private" / "case_00001" / "reference.npy").shape)
    payload, reason = _bad_outputs(shape)[kind]
    target = out_path(tmp_path, "case_00001")
    if isinstance(payload, bytes):
        target.write_bytes(payload)
    else:
        np.save(target, payload)
    r = grade(spec, tmp_path, data / "private")
    bad = {c.case: c for c in r.cases}["case_00001"]
    assert bad.score == 0.0 and bad.status == "invalid" and reason in (bad.reason or ""), bad.reason
    assert "agents_outputs/case_00001/enhanced.npy" in (bad.reason or "")
    assert r.score == pytest.approx(2 / 3)


def test_a_directory_in_place_of_the_file_is_invalid(twin, tmp_path):
    spec, data = twin
    out_path(tmp_path, "case_00000").mkdir()
    r = grade(spec, tmp_path, data / "private")
    assert r.cases[0].status == "invalid" and "not a regular file" in (r.cases[0].reason or "")


def test_data_range_comes_from_the_csv_then_the_reference(twin, tmp_path):
    spec, data = twin
    private = tmp_path / "private"
    shutil.copytree(data / "private", private)
    for case in ("case_00000", "case_00001", "case_00002"):
        ref = np.load(private / case / "reference.npy")
        noisy = ref + np.random.default_rng(0).normal(0, 0.05 * float(np.ptp(ref)), ref.shape)
        np.save(out_path(tmp_path / "ws", case), noisy.astype(np.float32))
    base = grade(spec, tmp_path / "ws", private)
    (private / "ground_truth.csv").write_text("patient_id,data_range\ncase_00000,1e9\n")
    changed = grade(spec, tmp_path / "ws", private)
    c0, c1 = changed.cases[0], changed.cases[1]
    assert c0.details["data_range"] == 1e9 and c0.details["ssim"] > base.cases[0].details["ssim"]
    assert c1.details["data_range_source"] == "reference max-min"
    assert c1.details["ssim"] == pytest.approx(base.cases[1].details["ssim"], abs=1e-12)


@pytest.mark.parametrize(
    "gate,expected", [("per_case_zero", 2 / 3), ("all_or_nothing", 0.0), ("times_completion", 2 / 3)]
)
def test_completeness_gate(twin, tmp_path, gate, expected):
    spec, data = twin
    perfect_submission(spec, data, tmp_path)
    out_path(tmp_path, "case_00002").unlink()
    r = grade(spec, tmp_path, data / "private", GradeOptions(completeness=gate))
    assert r.score == pytest.approx(expected) and r.checks["n_missing"] == 1


def test_empty_reference_is_one_clear_error(tmp_path):
    (tmp_path / "ref").mkdir()
    (tmp_path / "ws").mkdir()
    with pytest.raises(TaskError, match="no <case>/reference.npy"):
        grade(load_spec("ldct-denoising"), tmp_path / "ws", tmp_path / "ref")


@st.composite
def npy_files(draw):
    kind = draw(st.sampled_from(["raw", "array", "header-mangled", "right-shape"]))
    if kind == "raw":
        return draw(st.binary(max_size=400))
    if kind == "right-shape":  # the twin's 128x128: reaches SSIM with extreme or non-finite values
        pool = np.array(draw(st.lists(st.floats(width=32), min_size=1, max_size=8)), dtype=np.float32)
        idx = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, len(pool), (128, 128))
        buf = io.BytesIO()
        np.save(buf, pool[idx])
        return buf.getvalue()
    h = draw(st.integers(1, 20))
    w = draw(st.integers(1, 20))
    dt = draw(st.sampled_from(["<f4", ">f4", "<f8", "<i4", "|u1", "<f2"]))
    arr = np.full((h, w), draw(st.floats(allow_nan=True, allow_infinity=True, width=16)), dtype=np.float64)
    buf = io.BytesIO()
    with np.errstate(invalid="ignore", over="ignore"):
        np.save(buf, arr.astype(dt))
    raw = buf.getvalue()
    if kind == "header-mangled":
        cut = draw(st.integers(0, len(raw)))
        raw = raw[:cut] + draw(st.binary(max_size=20)) + raw[cut + 1 :]
    return raw


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.one_of(st.none(), npy_files()), min_size=3, max_size=3))
def test_property_malformed_outputs_never_crash(tmp_path_factory, make_twin, files):
    spec = load_spec("ldct-denoising")
    data = make_twin("ldct-denoising", 3, 2)
    ws = tmp_path_factory.mktemp("ws")
    for case, raw in zip(("case_00000", "case_00001", "case_00002"), files, strict=False):
        if raw is not None:
            out_path(ws, case).write_bytes(raw)
    r = grade(spec, ws, data / "private")
    assert 0.0 <= r.score <= 1.0 and len(r.cases) == 3
    for c in r.cases:
        assert 0.0 <= c.score <= 1.0
        assert (c.status == "scored") == (c.reason is None)
        if c.status == "scored":
            assert np.isfinite(c.details["ssim"]) and np.isfinite(c.details["psnr_db"])
