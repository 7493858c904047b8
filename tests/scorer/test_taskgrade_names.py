"""The submission the grader reads is written under the exact bytes of each sealed name."""

from __future__ import annotations

import os
from pathlib import Path

from schemas.blobstore import BlobStore
from schemas.events import RunStarted, SealedFile, SubmissionSealed
from schemas.ostext import os_text
from scorer.taskgrade import materialise
from scorer.trajectory import fold
from tests.fakes.events import unsigned_events


def test_materialise_writes_each_file_under_the_bytes_of_its_name(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    names = [b"agents_outputs/x\xff.txt", b"agents_outputs/a\\b", b"\\xff"]
    files = []
    for i, raw in enumerate(names):
        ref = blobs.put(b"%d" % i)
        files.append(SealedFile(path=os_text(raw), size=1, sha256=ref.blob, content=ref))
    files.append(SealedFile(path="\\x41", size=0, sha256="sha256:0", content=blobs.put(b"")))
    sealed = SubmissionSealed(root="/workspace", files=files)
    traj = fold("r", unsigned_events("r", "recorder", [RunStarted(), sealed]), blobs.get)
    into = tmp_path / "into"
    assert materialise(traj, blobs.get, into) == ["\\x41: not the recorded text of a name"]
    got = {
        os.path.relpath(os.path.join(d, f), os.fsencode(into)): open(os.path.join(d, f), "rb").read()
        for d, _, fs in os.walk(os.fsencode(into))
        for f in fs
    }
    assert got == {raw: b"%d" % i for i, raw in enumerate(names)}  # (main: the recorded text as the name)
