"""Enhancement twins: layout, dtypes, the noise / downsampling relation, determinism."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from tasks.registry import load_spec
from tasks.synth import synth
from tasks.synth.enhancement import kspace_downsample
from tests.tasks.helpers import twin_is_deterministic


@pytest.mark.parametrize("task", ["ldct-denoising", "mri-sr"])
def test_layout_and_determinism(tmp_path, task):
    spec = load_spec(task)
    twin_is_deterministic(spec, tmp_path, 3, 7)
    cases = sorted(p.name for p in (tmp_path / "a" / "public").iterdir())
    assert cases == ["case_00000", "case_00001", "case_00002"]
    rows = {
        r["patient_id"]: float(r["data_range"])
        for r in csv.DictReader(open(tmp_path / "a" / "private" / "ground_truth.csv"))
    }
    for case in cases:
        inp = np.load(tmp_path / "a" / "public" / case / "input.npy")
        ref = np.load(tmp_path / "a" / "private" / case / "reference.npy")
        assert inp.dtype == ref.dtype == np.float32 and inp.ndim == 2
        assert spec.enh is not None
        assert ref.shape == tuple(spec.enh.synth_shape)
        assert ref.shape == tuple(s * spec.enh.scale for s in inp.shape)
        assert np.isfinite(inp).all() and np.isfinite(ref).all()
        assert rows[case] == pytest.approx(float(ref.max()) - float(ref.min()))
    assert not (tmp_path / "a" / "public" / "ground_truth.csv").exists()


def test_ldct_is_hu_with_ct_like_noise(tmp_path):
    spec = load_spec("ldct-denoising")
    synth(spec, tmp_path, 4, 0)
    for case in sorted((tmp_path / "public").iterdir()):
        inp = np.load(case / "input.npy")
        ref = np.load(tmp_path / "private" / case.name / "reference.npy")
        assert -1024 <= ref.min() < -900 and 150 < ref.max() <= 3071  # air and contrast/bone
        noise = inp - ref
        body, air = ref > -200, ref < -950
        assert 15 < noise[body].std() < 60  # quarter-dose noise in tissue, HU
        assert noise[air].std() < noise[body].std()  # photon starvation: less noise outside the body
        # grainy, not white: neighbouring noise pixels are correlated (negatively, for a ramp NPS)
        lag = np.corrcoef(noise[:, :-1].ravel(), noise[:, 1:].ravel())[0, 1]
        assert abs(lag) > 0.05


def test_mri_input_is_the_central_kspace_of_the_reference(tmp_path):
    spec = load_spec("mri-sr")
    synth(spec, tmp_path, 2, 0)
    ref = np.load(tmp_path / "private" / "case_00001" / "reference.npy")
    inp = np.load(tmp_path / "public" / "case_00001" / "input.npy")
    assert 0.0 <= ref.min() and ref.max() == pytest.approx(1.0)
    np.testing.assert_allclose(inp, kspace_downsample(ref.astype(np.float64), 2), atol=1e-6)
    # the reference has fine detail beyond the input's band: its high-frequency energy is not small
    k = np.fft.fftshift(np.fft.fft2(ref))
    h, w = ref.shape
    outer = k.copy()
    outer[h // 4 : h // 4 + h // 2, w // 4 : w // 4 + w // 2] = 0
    assert np.sum(np.abs(outer) ** 2) / np.sum(np.abs(k) ** 2) > 1e-3
