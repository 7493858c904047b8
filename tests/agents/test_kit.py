"""The baseline's standard-library kit library reads and writes what numpy, nibabel and Pillow do."""

from __future__ import annotations

import gzip

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from agents.baseline import kit_lib as kit


def test_nifti_roundtrip_keeps_grid_and_values(tmp_path):
    data = np.arange(5 * 4 * 3, dtype=np.int16).reshape(5, 4, 3) - 30
    affine = np.diag([0.8, 0.8, 2.5, 1.0])
    affine[:3, 3] = [10, -5, 3]
    nib.save(nib.Nifti1Image(data, affine), tmp_path / "in.nii.gz")
    vol = kit.read_nifti(str(tmp_path / "in.nii.gz"))
    assert vol.shape == (5, 4, 3)
    assert vol.spacing == pytest.approx((0.8, 0.8, 2.5))
    assert np.array_equal(np.array(vol.values).reshape(vol.shape, order="F"), data)
    mask = bytearray(1 if v > 0 else 0 for v in vol.values)
    kit.write_nifti(str(tmp_path / "out" / "mask.nii.gz"), vol, mask)
    out = nib.nifti1.load(tmp_path / "out" / "mask.nii.gz")
    assert out.shape == data.shape and out.get_data_dtype() == np.uint8
    assert np.allclose(out.affine, affine)
    assert np.array_equal(np.asarray(out.dataobj), (data > 0).astype(np.uint8))


def test_nifti_scaling_is_applied(tmp_path):
    img = nib.Nifti1Image(np.ones((2, 2, 2), dtype=np.int16), np.eye(4))
    img.header.set_slope_inter(2.0, -1.0)
    nib.save(img, tmp_path / "s.nii")
    assert set(kit.read_nifti(str(tmp_path / "s.nii")).values) == {1.0}


def test_not_a_nifti_is_a_clear_error(tmp_path):
    (tmp_path / "x.nii.gz").write_bytes(gzip.compress(b"\0" * 400))
    with pytest.raises(ValueError, match="not a NIfTI-1"):
        kit.read_nifti(str(tmp_path / "x.nii.gz"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_npy_roundtrip(tmp_path, dtype):
    a = (np.arange(12, dtype=dtype).reshape(3, 4) - 5.5) * 1.25
    np.save(tmp_path / "a.npy", a)
    shape, values = kit.read_npy(str(tmp_path / "a.npy"))
    assert shape == (3, 4) and np.allclose(np.array(values).reshape(shape), a)
    kit.write_npy(str(tmp_path / "b.npy"), shape, values)
    b = np.load(tmp_path / "b.npy")
    assert b.dtype == np.float32 and b.shape == (3, 4) and np.allclose(b, a)


def test_smoothing_and_upsampling_shapes():
    shape, values = (4, 5), [float(i) for i in range(20)]
    flat = kit.smooth(shape, [7.0] * 20)
    assert flat == pytest.approx([7.0] * 20)  # a filter that preserves constants
    assert len(kit.smooth(shape, values)) == 20
    (h, w), up = kit.upsample(shape, values, 2)
    assert (h, w) == (8, 10) and len(up) == 80 and min(up) >= 0 and max(up) <= 19


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "P"])
def test_png_decoder_matches_pillow(tmp_path, mode):
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, size=(23, 31, 3), dtype=np.uint8)
    img = Image.fromarray(rgb, "RGB").convert(mode)
    img.save(tmp_path / "x.png")  # Pillow picks filter types per row: all five get exercised
    width, height, gray = kit.read_png_gray(str(tmp_path / "x.png"))
    want = np.asarray(Image.open(tmp_path / "x.png").convert("RGB").convert("L"), dtype=int)
    assert (width, height) == (31, 23)
    assert np.abs(np.array(gray).reshape(height, width) - want).max() <= 1


def test_flowchart_png_is_a_valid_image(tmp_path):
    kit.flowchart_png(str(tmp_path / "plan.png"), ["load", "infer", "save"])
    with Image.open(tmp_path / "plan.png") as im:
        assert im.format == "PNG" and im.size[0] == 640


def test_components_do_not_wrap_across_rows():
    # two pixels at the end of row 0 and the start of row 1 are not neighbours
    mask = [0, 0, 1, 1, 0, 0]
    assert sorted(len(c) for c in kit.components(mask, (3, 2))) == [1, 1]
    assert [len(c) for c in kit.components([1, 1, 0, 0, 1, 0], (3, 2))] == [3]
