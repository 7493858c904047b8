"""Arrays a run wrote, read defensively (NIfTI-1 and NIfTI-2, gzip or not; ``.npy``), by the grader
and the viewer's previews alike. A header is read before any data, so a caller refuses a shape, a
type or a size first (a hostile header allocates nothing); pickled data is never unpickled."""

from __future__ import annotations

import gzip
import io
import math
import os
import struct
from typing import BinaryIO, NamedTuple

import nibabel as nib
import numpy as np

NIFTI2_HEADER = 540
"""``sizeof_hdr`` of a NIfTI-2 header (a NIfTI-1 header's is 348), its first field."""

MAX_VOXEL_OFFSET = 16 * 2**20
"""Where a NIfTI file's voxels may start at most (its ``vox_offset``): a header and its extensions
are read from these many first bytes at most, whatever sizes they claim."""


class ArrayError(ValueError):
    """A NIfTI or ``.npy`` file that cannot be read; the message says why, without naming the file."""


def load_nifti(f: BinaryIO) -> nib.Nifti1Image | nib.Nifti2Image:
    """A NIfTI-1 or NIfTI-2 image read from an open file (gzip-compressed or not, told by its bytes).

    The format is sniffed, not taken from a file name (the grader reads a descriptor it opened and
    checked itself, the viewer a blob). Only the header is read here: voxels are read lazily from
    ``f`` (``np.asanyarray(img.dataobj)``), which must stay open while they are used. The header and
    its extensions are parsed from the bytes before ``vox_offset`` only, and a ``vox_offset`` past
    ``MAX_VOXEL_OFFSET`` is an ``ArrayError``."""
    compressed = f.read(2) == b"\x1f\x8b"
    f.seek(0)
    src: BinaryIO = gzip.GzipFile(fileobj=f, mode="rb") if compressed else f  # type: ignore[assignment]  # a GzipFile is a binary file
    fixed = src.read(NIFTI2_HEADER)
    head = fixed[:4]
    # sizeof_hdr, in either byte order.
    sizes = (struct.unpack("<i", head)[0], struct.unpack(">i", head)[0]) if len(head) == 4 else (0, 0)
    klass = nib.Nifti2Image if NIFTI2_HEADER in sizes else nib.Nifti1Image
    header_class = klass.header_class
    size = header_class.template_dtype.itemsize
    at = float(header_class(fixed[:size])["vox_offset"])  # type: ignore[no-untyped-call]  # nibabel's headers are untyped
    if not at <= MAX_VOXEL_OFFSET:  # NaN too
        raise ArrayError(
            f"its voxels start at byte {at:.0f}, past the {MAX_VOXEL_OFFSET} bytes "
            "a header and its extensions may take"
        )
    # nibabel reads extensions from its file up to vox_offset (to the file's end for a vox_offset of
    # 0), each as one read of the size it claims (up to 2 GiB, which a GzipFile allocates): from an
    # in-memory copy of those bytes, no read can reach past them.
    src.seek(0)
    prefix = io.BytesIO(src.read(int(max(at, size + 4))))
    header = header_class.from_fileobj(prefix)  # type: ignore[no-untyped-call]
    # As nibabel's from_file_map builds it: voxels read from ``src`` at vox_offset.
    voxels = klass.ImageArrayProxy(src, header.copy(), mmap=False)  # type: ignore[no-untyped-call]
    return klass(voxels, header.get_best_affine(), header)  # type: ignore[no-untyped-call]


class NpyHeader(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    """What the data the header describes takes (at most what the file holds after the header)."""


def npy_header(f: BinaryIO) -> NpyHeader:
    """The header of the ``.npy`` array in ``f`` (a seekable file, read from its start), checked:
    a single array (not an ``.npz`` archive), no pickled objects, and as many data bytes in the file
    as the header claims. ``ArrayError`` otherwise."""
    fmt = np.lib.format
    try:
        if f.read(6).startswith(b"PK\x03\x04"):
            raise ArrayError("an .npz archive, not a single .npy array")
        f.seek(0)
        version = fmt.read_magic(f)
        header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = header(f)
        start = f.tell()
        has = f.seek(0, os.SEEK_END) - start
    except ArrayError:
        raise
    except Exception as e:  # numpy raises ValueError, OSError, EOFError, SyntaxError, ...
        raise ArrayError(f"not a readable .npy array ({type(e).__name__}: {e})") from None
    if dtype.hasobject:
        raise ArrayError("not a readable .npy array (it holds pickled objects, never unpickled)")
    claims = math.prod(shape) * dtype.itemsize
    if has < claims:  # checked before anything is read: a header may claim a huge array
        raise ArrayError(f"not a readable .npy array (truncated: {has} of {claims} data bytes)")
    return NpyHeader(tuple(shape), dtype, claims)


def read_npy(f: BinaryIO) -> np.ndarray:
    """The array of a ``.npy`` file whose header ``npy_header`` accepted (never unpickled)."""
    f.seek(0)
    return np.lib.format.read_array(f, allow_pickle=False)
