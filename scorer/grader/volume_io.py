"""Reading a submitted NIfTI volume defensively: every way it can be wrong becomes a one-line reason.

The file is read by ``replay.arrays.load_nifti`` (NIfTI-1 and NIfTI-2, gzip or not), the reader the
viewer's previews use too. The header is checked before any voxel is read: a wrong shape or an
unsupported dtype is rejected without decompressing anything, so a huge or hostile file cannot
exhaust memory, and the size of what is read is bounded by the reference's shape. Voxels are read
with ``np.asanyarray(dataobj)``, which keeps integer label maps in their integer dtype
(``get_fdata`` would make a float64 copy 8× the size of a uint8 map).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError
from nibabel.wrapstruct import WrapStructError

from replay.arrays import load_nifti

# What nibabel, gzip and numpy raise on truncated, corrupt or nonsensical files.
_READ_ERRORS = (
    *(OSError, EOFError, ValueError, TypeError, MemoryError, OverflowError, IndexError, KeyError),
    *(struct.error, zlib.error, gzip.BadGzipFile, ImageFileError, HeaderDataError, WrapStructError),
)


class VolumeError(Exception):
    """A submitted volume cannot be scored; the message is the case's reason."""

    def __init__(self, reason: str, kind: str = "unreadable") -> None:
        super().__init__(reason)
        self.kind = kind
        """``missing``, ``unreadable``, ``shape``, ``dtype`` or ``values``."""


def read_volume(
    source: Path | BinaryIO, expected_shape: tuple[int, ...] | None, name: str = ""
) -> np.ndarray:
    """The voxels of ``source`` (a trusted path, or a submitted file already opened and checked),
    checked: shape (if given), numeric dtype, finite values. ``name`` names it in reasons."""
    if isinstance(source, Path):
        name = name or source.name
        if not source.is_file():
            raise VolumeError(f"{name}: missing", "missing")
        try:
            with open(source, "rb") as f:
                return _read_volume(f, expected_shape, name)
        except OSError as e:
            raise VolumeError(f"{name}: not a readable NIfTI file ({_brief(e)})") from e
    return _read_volume(source, expected_shape, name)


def _read_volume(f: BinaryIO, expected_shape: tuple[int, ...] | None, name: str) -> np.ndarray:
    try:
        img = load_nifti(f)
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
