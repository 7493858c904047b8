"""The files a run wrote (``/api/runs/RUN/files``, every version and one's content), previews of
arrays as images, and blobs by address (``/api/blobs/sha256:HEX``)."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import quote

import duckdb
import msgspec
from msgspec import UNSET, UnsetType

from replay.store import first
from replay.web.calls import sniff_image
from replay.web.resource import IMAGE_CAP, RAW_CAP, BadRequest, NotFound
from schemas.blob import DIGEST_RE
from schemas.blobstore import BlobStore
from schemas.errors import BlobError


class FileVersion(msgspec.Struct):
    key: str
    """The event that wrote it (``SOURCE:SEQ``)."""
    seq: int
    ts_ns: str
    op: str
    size: int | None
    sha256: str | None
    blob: str | None


class FileContent(msgspec.Struct):
    """One version's content, by ``kind``: ``text`` (the first 64 KiB), ``image`` (a blob URL),
    ``volume`` (a preview URL), ``binary`` (a download URL), ``error`` (why it cannot be read) or
    ``none`` (not stored: above the size cap)."""

    kind: Literal["text", "image", "volume", "binary", "error", "none"]
    text: str | UnsetType = UNSET
    truncated: bool | UnsetType = UNSET
    media_type: str | UnsetType = UNSET
    size: int | UnsetType = UNSET
    url: str | UnsetType = UNSET
    error: str | UnsetType = UNSET


class FileVersions(msgspec.Struct):
    """``GET /api/runs/RUN/files?path=P[&seq=N]``: every version of a file the run wrote, and the
    content of one (the last, or the one at ``seq``)."""

    path: str
    versions: list[FileVersion]
    shown: int
    content: FileContent


def file_versions(
    con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, path: str, version: int | None
) -> FileVersions:
    rows = con.execute(
        """SELECT seq, ts_ns, op, size, sha256, content_blob FROM file_writes
           WHERE run_id = ? AND path = ? ORDER BY ts_ns, seq""",
        [run_id, path],
    ).fetchall()
    if not rows:
        raise NotFound(f"run {run_id!r} wrote no file {path[:200]!r}")
    # file.written rows carry their source in the key (the shim writes them), except synthetic
    # or imported runs; look the real source up so links land on the event.
    sources = dict(
        con.execute(
            "SELECT seq, source FROM events WHERE run_id = ? AND kind = 'file.written' "
            "AND payload->>'$.path' = ?",
            [run_id, path],
        ).fetchall()
    )
    versions = [
        FileVersion(f"{sources.get(s, 'shim')}:{s}", s, str(t), op, size, sha, blob)
        for s, t, op, size, sha, blob in rows
    ]
    chosen = versions[-1] if version is None else next((v for v in versions if v.seq == version), None)
    if chosen is None:
        raise NotFound(f"no version at seq {version} of {path[:200]!r}")
    return FileVersions(path, versions, chosen.seq, _content(blobs, run_id, path, chosen))


def _content(blobs: BlobStore, run_id: str, path: str, chosen: FileVersion) -> FileContent:
    if not chosen.blob:
        return FileContent("none")
    try:
        data = blobs.get(chosen.blob)
    except BlobError as e:
        return FileContent("error", error=str(e))
    media = sniff_image(data)
    if is_volume(path):
        url = f"/api/runs/{quote(run_id, safe='')}/files/preview?path={quote(path, safe='')}&seq={chosen.seq}"
        return FileContent("volume", size=len(data), url=url)
    if media and len(data) <= IMAGE_CAP:
        return FileContent("image", media_type=media, url=f"/api/blobs/{chosen.blob}")
    try:
        return FileContent("text", text=data[:RAW_CAP].decode("utf-8"), truncated=len(data) > RAW_CAP)
    except UnicodeDecodeError:
        return FileContent("binary", size=len(data), url=f"/api/blobs/{chosen.blob}?download=1")


VOLUME_SUFFIXES = (".nii", ".nii.gz", ".npy")
VOLUME_CAP = 256 * 1024 * 1024
"""Largest array (in bytes, once loaded) the preview will read."""
PREVIEW_SIDE = 512


def is_volume(path: str) -> bool:
    return path.lower().endswith(VOLUME_SUFFIXES)


def file_preview(con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, path: str, seq: int) -> bytes:
    """``GET /api/runs/RUN/files/preview?path=P&seq=N``: the middle slice of a NIfTI volume or a
    ``.npy`` array the run wrote, as a PNG (window: 1st to 99th percentile; at most 512 px a side).
    The header is read first and an array above 256 MiB is refused, so a hostile header cannot make
    the viewer allocate what it claims."""
    import io

    import numpy as np
    from PIL import Image

    from replay.arrays import load_nifti, npy_header, read_npy

    row = first(
        con.execute(
            "SELECT content_blob FROM file_writes WHERE run_id = ? AND path = ? AND seq = ?",
            [run_id, path, seq],
        )
    )
    if row is None or not row[0]:
        raise NotFound(f"no stored version at seq {seq} of {path[:200]!r}")
    if not is_volume(path):
        raise BadRequest("previews are for .nii, .nii.gz and .npy files")
    data = blobs.get(row[0])
    # Read as the grader reads submissions (replay.arrays); a size the header claims is refused first.
    f = io.BytesIO(data)
    try:
        if path.lower().endswith(".npy"):
            if npy_header(f).nbytes > VOLUME_CAP:
                raise BadRequest(f"the array is larger than {VOLUME_CAP} bytes")
            arr = read_npy(f)
        else:
            img: Any = load_nifti(f)  # nibabel has no type information
            if int(np.prod(img.shape)) * img.get_data_dtype().itemsize > VOLUME_CAP:
                raise BadRequest(f"the volume is larger than {VOLUME_CAP} bytes")
            arr = np.asanyarray(img.dataobj)
    except BadRequest:
        raise
    except Exception as e:  # a hostile or broken file: any parser error is the file's fault
        raise BadRequest(f"cannot read {path[:200]!r} as an array: {type(e).__name__}: {e}") from None
    arr = np.squeeze(np.asarray(arr))
    while arr.ndim > 2:
        arr = arr[..., arr.shape[-1] // 2]
    if arr.ndim != 2 or arr.size == 0:
        raise BadRequest(f"{path[:200]!r} holds no 2-D slice (shape {arr.shape})")
    values = arr.astype(np.float64)
    finite = values[np.isfinite(values)]
    lo, hi = np.percentile(finite, [1, 99]) if finite.size else (0.0, 1.0)
    scaled = np.clip((np.nan_to_num(values) - lo) / ((hi - lo) or 1.0), 0, 1)
    image = Image.fromarray((scaled.T[::-1] * 255).astype(np.uint8))
    image.thumbnail((PREVIEW_SIDE, PREVIEW_SIDE))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def blob_bytes(blobs: BlobStore, sha: str) -> bytes:
    if not DIGEST_RE.match(sha):
        raise BadRequest("a blob address is sha256: followed by 64 lowercase hex digits")
    try:
        return blobs.get(sha)
    except BlobError as e:
        raise NotFound(str(e)) from None
