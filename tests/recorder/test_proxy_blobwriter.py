"""The proxy's fast blob writer produces exactly what the shared BlobStore writes, reads and verifies."""

from __future__ import annotations

import hashlib
import os
import stat
import threading

from recorder.proxy.blobwriter import BlobWriter
from schemas.blobstore import BlobStore


def test_written_blobs_read_back_through_the_store(tmp_path):
    w = BlobWriter(tmp_path / "blobs")
    data = [b"", b"small", os.urandom(3000), b"A" * (2 * 1024 * 1024)]
    refs = [w.put(d, "application/json") for d in data]
    assert w.put(b"small").blob == refs[1].blob  # write-once: the same bytes, the same address
    store = BlobStore(tmp_path / "blobs")
    for d, ref in zip(data, refs):
        assert store.get(ref) == d and ref.size == len(d)
        assert not stat.S_IMODE(store.path_of(ref.blob).stat().st_mode) & 0o222  # read-only
    w.sync()
    w.close()
    assert not list((tmp_path / "blobs").glob(".tmp-*"))  # the pool of temporary files is gone


def test_same_files_as_the_blob_store(tmp_path):
    # A growing conversation, as an agent resends it: chunked, so the shared prefix is stored once.
    messages = [b'{"role": "user", "content": "%s"}' % hashlib.sha256(b"%d" % i).hexdigest().encode() * 40
                for i in range(41)]
    turns = [b"[" + b"},{".join(messages[:n]) + b"]" for n in (40, 41)]
    w = BlobWriter(tmp_path / "mine")
    refs = [w.put(t) for t in turns]
    w.close()
    ref_store = BlobStore(tmp_path / "theirs")
    assert [ref_store.put(t, sync=False) for t in turns] == refs
    mine = {p.relative_to(tmp_path / "mine"): p.read_bytes() for p in (tmp_path / "mine").glob("??/*")}
    theirs = {p.relative_to(tmp_path / "theirs"): p.read_bytes() for p in (tmp_path / "theirs").glob("??/*")}
    assert mine == theirs and len(mine) > 3  # byte-identical files, chunk lists included
    assert BlobStore(tmp_path / "mine").get(refs[1]) == turns[1]


def test_concurrent_writers_of_the_same_content(tmp_path):
    writers = [BlobWriter(tmp_path / "blobs") for _ in range(4)]
    payload = os.urandom(100_000)
    refs = []
    threads = [threading.Thread(target=lambda w=w: refs.append(w.put(payload))) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.blob for r in refs}) == 1
    assert BlobStore(tmp_path / "blobs").get(refs[0]) == payload
    for w in writers:
        w.close()
