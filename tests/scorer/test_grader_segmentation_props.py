"""Property: no malformed segmentation submission crashes the grader; every case gets a score or a reason."""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scorer.grader import grade
from scorer.grader.options import GradeOptions
from tasks import synth
from tasks.registry import load_spec

TASKS = ["kidney-seg", "feta-seg", "pancreas-oar-seg"]
_data: dict[str, Path] = {}


def twin(task_id: str) -> Path:
    if task_id not in _data:
        root = Path(tempfile.mkdtemp(prefix=f"amb-prop-{task_id}-"))
        synth.synth(load_spec(task_id), root, cases=2, seed=1)
        _data[task_id] = root
    return _data[task_id]


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    for root in _data.values():
        shutil.rmtree(root, ignore_errors=True)


DTYPES = [np.uint8, np.int16, np.int32, np.int64, np.uint16, np.float32, np.float64, np.int8]
SPECIAL = [np.nan, np.inf, -np.inf, -1.0, 0.5, 1.0, 2.0, 7.0, 255.0, 1e9, -1e9]


@st.composite
def volume_bytes(draw, ref_shape: tuple[int, ...]) -> bytes | None:
    """One submitted file: absent, garbage, a truncated or odd NIfTI, or a plausible one with bad values."""
    kind = draw(st.sampled_from(["absent", "garbage", "gzip_garbage", "empty", "nifti", "truncated", "dir"]))
    if kind == "absent":
        return None
    if kind == "dir":
        return b"DIR"
    if kind == "empty":
        return b""
    if kind == "garbage":
        return draw(st.binary(max_size=400))
    if kind == "gzip_garbage":
        return gzip.compress(draw(st.binary(max_size=400)))
    shape = draw(
        st.sampled_from(
            [ref_shape, ref_shape[:2], (*ref_shape, 1), (1, 1, 1), (ref_shape[0] + 1, *ref_shape[1:])]
        )
    )
    dtype = draw(st.sampled_from(DTYPES))
    n = int(np.prod(shape))
    # A short drawn pattern tiled over the volume: hypothesis shrinks the pattern, the volume stays real-
    # sized.
    pool = [0.0, 1.0, 2.0, 3.0] + (SPECIAL if np.dtype(dtype).kind == "f" else [-1.0, 7.0, 255.0])
    values = np.resize(np.array(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=16))), n)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        values = np.clip(values, info.min, info.max)
    arr = values.reshape(shape).astype(dtype)
    img = nib.Nifti1Image(arr, np.eye(4), dtype=arr.dtype)
    data = gzip.compress(img.to_bytes())
    if kind == "truncated":
        raw = img.to_bytes()
        cut = draw(st.integers(0, len(raw) - 1))
        data = gzip.compress(raw[:cut]) if draw(st.booleans()) else data[: max(1, len(data) // 2)]
    return data


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.data(),
    task_id=st.sampled_from(TASKS),
    gate=st.sampled_from(["per_case_zero", "all_or_nothing", "times_completion"]),
)
def test_malformed_submissions_never_crash(tmp_path_factory, data, task_id, gate):
    spec = load_spec(task_id)
    root = twin(task_id)
    ws = tmp_path_factory.mktemp("ws")
    private = root / "private"
    for case_dir in sorted(p for p in private.iterdir() if p.is_dir()):
        for ref_file in sorted(case_dir.iterdir()):
            ref_shape = tuple(nib.nifti1.load(str(ref_file)).shape)
            content = data.draw(volume_bytes(ref_shape))
            if content is None:
                continue
            dest = ws / spec.submission.root / case_dir.name / ref_file.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if content == b"DIR":
                dest.mkdir()
            else:
                dest.write_bytes(content)
    result = grade(spec, ws, private, GradeOptions(completeness=gate))
    assert 0.0 <= result.score <= 1.0
    assert len(result.cases) == 2
    for case in result.cases:
        assert 0.0 <= case.score <= 1.0
        if case.status == "scored":
            assert case.reason is None
        else:
            assert case.score == 0.0 and case.reason, case
