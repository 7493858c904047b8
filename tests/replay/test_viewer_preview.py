"""File previews in the viewer: the middle slice of a NIfTI volume or a .npy array a run wrote,
as a PNG; broken and hostile files are refused with a reason, never read blindly."""

from __future__ import annotations

import gzip
import io
import json
import urllib.error
import urllib.parse
import urllib.request

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from recorder.spool import SpoolWriter, spool_path
from replay.ingest import ingest
from replay.web.server import Running
from schemas.blob import digest
from schemas.blobstore import BlobStore
from schemas.events import FileWritten, RunFinished, RunStarted


def nifti_gz(arr: np.ndarray) -> bytes:
    return gzip.compress(nib.Nifti1Image(arr, np.eye(4)).to_bytes())


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("preview") / "store"
    blobs = BlobStore(root / "blobs")
    vol = np.zeros((20, 16, 9), dtype=np.int16)
    vol[5:15, 4:12, 4] = 1000  # a bright square only on the middle slice (z = 4)
    huge = bytearray(nib.Nifti1Image(np.zeros((2, 2, 2), np.uint8), np.eye(4)).to_bytes())
    header = nib.Nifti1Header.from_fileobj(io.BytesIO(bytes(huge)))
    header.set_data_shape((30000, 30000, 30000))  # claims 27 TB of voxels; the bytes are a few
    huge[: len(header.binaryblock)] = header.binaryblock
    files = {
        "out/ct.nii.gz": nifti_gz(vol),
        "out/ct2.nii": nib.Nifti2Image(vol, np.eye(4)).to_bytes(),
        "out/ct2.nii.gz": gzip.compress(nib.Nifti2Image(vol, np.eye(4)).to_bytes()),
        "out/mask.npy": npy(np.arange(12 * 10, dtype=np.float32).reshape(12, 10)),
        "out/broken.nii.gz": b"\x1f\x8b not really gzip",
        "out/huge.nii": bytes(huge),
        "out/pickle.npy": b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
        + b" " * 60,
    }
    w = {s: SpoolWriter(spool_path(root, "vol", s), "vol", s, sync=False) for s in ("recorder", "shim")}
    w["recorder"].append(RunStarted(task="kidney-seg", backend="synthetic"), ts_ns=1)
    for i, (path, data) in enumerate(files.items()):
        ref = blobs.put(data, "application/octet-stream", sync=False)
        w["shim"].append(
            FileWritten(path=path, op="created", size=len(data), sha256=digest(data), content=ref),
            ts_ns=10 + i,
        )
    w["recorder"].append(RunFinished(status="completed", exit_code=0), ts_ns=100)
    for x in w.values():
        x.close()
    ingest(root)
    with Running(root) as running:
        yield running


def fetch(server, path: str):
    try:
        with urllib.request.urlopen(server.url + path, timeout=60) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def preview_url(server, path: str) -> str:
    status, _, body = fetch(server, "/api/runs/vol/files?path=" + urllib.parse.quote(path, safe=""))
    assert status == 200, body
    content = json.loads(body)["content"]
    assert content["kind"] == "volume"
    return content["url"]


def test_nifti_middle_slice(server):
    status, ctype, body = fetch(server, preview_url(server, "out/ct.nii.gz"))
    assert status == 200 and ctype == "image/png"
    img = np.asarray(Image.open(io.BytesIO(body)))
    assert img.shape == (16, 20)  # rows = y, columns = x, the z = 4 slice
    assert img.max() == 255 and img.min() == 0 and (img == 255).sum() == 10 * 8


@pytest.mark.parametrize("path", ["out/ct2.nii", "out/ct2.nii.gz"])
def test_a_nifti2_volume_previews_as_the_grader_reads_it(server, path):
    """NIfTI-2 (a 540-byte header, 64-bit dimensions) is read by the grader's reader, and so here."""
    status, ctype, body = fetch(server, preview_url(server, path))
    assert status == 200 and ctype == "image/png", body
    img = np.asarray(Image.open(io.BytesIO(body)))
    assert img.shape == (16, 20) and (img == 255).sum() == 10 * 8


def test_npy_preview(server):
    status, ctype, body = fetch(server, preview_url(server, "out/mask.npy"))
    assert status == 200 and ctype == "image/png"
    assert Image.open(io.BytesIO(body)).size == (12, 10)


@pytest.mark.parametrize(
    "path, why",
    [
        ("out/broken.nii.gz", "cannot read"),
        ("out/huge.nii", "larger than"),
        ("out/pickle.npy", "cannot read"),
    ],
)
def test_hostile_files_are_refused(server, path, why):
    status, _, body = fetch(server, preview_url(server, path))
    assert status == 400 and why in json.loads(body)["error"]
