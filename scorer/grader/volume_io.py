"""Reading a submitted NIfTI volume defensively: every way it can be wrong becomes a one-line reason.

The header is checked before any voxel is read: a wrong shape or an unsupported dtype is rejected
without decompressing anything, so a huge or hostile file cannot exhaust memory, and the size of
what is read is bounded by the reference's shape. Voxels are read with ``np.asanyarray(dataobj)``,
which keeps integer label maps in their integer dtype (``get_fdata`` would make a float64 copy 8×
the size of a uint8 map).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError

# What nibabel, gzip and numpy raise on truncated, corrupt or nonsensical files.
_READ_ERRORS = (
    OSError,
    EOFError,
    ValueError,
    TypeError,
    struct.error,
    zlib.error,
    gzip.BadGzipFile,
    ImageFileError,
    HeaderDataError,
    MemoryError,
    OverflowError,
    IndexError,
    KeyError,
)


class VolumeError(Exception):
    """A submitted volume cannot be scored; the message is the case's reason."""

    def __init__(self, reason: str, kind: str = "unreadable") -> None:
        super().__init__(reason)
        self.kind = kind
        """``missing``, ``unreadable``, ``shape``, ``dtype`` or ``values``."""


def header_shape(path: Path) -> tuple[int, ...]:
    """The shape a NIfTI header declares (reads the header only)."""
    try:
        return tuple(int(n) for n in nib.load(str(path)).shape)
    except _READ_ERRORS as e:
        raise VolumeError(f"{path.name}: not a readable NIfTI file ({_brief(e)})") from e


def read_volume(path: Path, expected_shape: tuple[int, ...] | None) -> np.ndarray:
    """The voxels of ``path``, checked: shape (if given), numeric dtype, finite values."""
    name = path.name
    if not path.is_file():
        raise VolumeError(f"{name}: missing", "missing")
    try:
        img = nib.load(str(path))
        shape = tuple(int(n) for n in img.shape)
        dtype = img.get_data_dtype()
    except _READ_ERRORS as e:
        raise VolumeError(f"{name}: not a readable NIfTI file ({_brief(e)})") from e
    if expected_shape is not None and shape != tuple(expected_shape):
        raise VolumeError(
            f"{name}: shape {_fmt(shape)} does not match the reference {_fmt(expected_shape)}", "shape"
        )
    if dtype.fields is not None or dtype.kind not in "biuf":
        raise VolumeError(f"{name}: unsupported voxel type {dtype} (expected integers or floats)", "dtype")
    try:
        data = np.asanyarray(img.dataobj)
    except _READ_ERRORS as e:
        raise VolumeError(f"{name}: voxel data unreadable ({_brief(e)})") from e
    if data.shape != shape:
        raise VolumeError(f"{name}: voxel data has shape {_fmt(data.shape)}, header says {_fmt(shape)}")
    if data.dtype.kind == "f" and not np.isfinite(data).all():
        raise VolumeError(f"{name}: contains NaN or infinite values", "values")
    return data


def _fmt(shape: tuple[int, ...]) -> str:
    return "×".join(str(n) for n in shape) if shape else "()"


def _brief(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:160]
