"""The proxy's blob writer: blobs go to a run pack during the run and become exactly the blobs
(the same addresses, the same chunks) the shared BlobStore stores, reads and verifies, in the
store's packs, when the writer closes or when ingest finds the run pack of a recorder that died."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from typing import Any

import pytest

from recorder.proxy.blobwriter import YIELD_EVERY, BlobWriter, RecentChunks
from recorder.spool import SpoolWriter, spool_path
from replay.ingest import ingest
from replay.store import Store
from replay.verify import verify
from schemas import packstore
from schemas.blobpack import MAGIC, pack_path, read_records
from schemas.blobstore import CHUNK_MAGIC, BlobStore
from schemas.errors import SpoolError
from schemas.events import Note, RunStarted


def writer(root, run="r"):
    return BlobWriter(root / "blobs", pack_path(spool_path(root, run, "proxy")))


def stored_files(blobs):
    """The addresses stored under ``blobs`` (in packs or loose) and whether each is a chunk list."""
    out = {p.parent.name + p.name: p.read_bytes().startswith(CHUNK_MAGIC) for p in blobs.glob("??/*")}
    for pack in sorted(blobs.glob("packs/*.pack")):
        out.update({r.hexd: r.codec == ord("c") for r in packstore.scan(pack)})
    return out


def test_blobs_are_in_the_store_once_the_writer_closes(tmp_path):
    w = writer(tmp_path)
    data = [b"", b"small", os.urandom(3000), b"A" * (2 * 1024 * 1024)]
    refs = [w.put(d, "application/json") for d in data]
    assert w.put(b"small").blob == refs[1].blob  # write-once: the same bytes, the same address
    assert not stored_files(tmp_path / "blobs")  # nothing created while the run lasts: all in the pack
    w.sync()
    w.close()
    store = BlobStore(tmp_path / "blobs")
    for d, ref in zip(data, refs, strict=False):
        assert store.get(ref) == d and ref.size == len(d)
    assert not w.pack.exists()  # materialised, then removed
    assert all(not stat.S_IMODE(p.stat().st_mode) & 0o222 for p in store.pack_files())  # read-only
    assert not [p for p in (tmp_path / "blobs").rglob("*") if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("size", [YIELD_EVERY - 1, YIELD_EVERY, YIELD_EVERY + 1, 3 * YIELD_EVERY + 5])
def test_a_body_hashed_in_pieces_has_its_whole_sha256(tmp_path, size):
    data = os.urandom(size)
    w = writer(tmp_path)
    ref = w.put(data)
    w.close()
    assert ref.blob == "sha256:" + hashlib.sha256(data).hexdigest()
    assert BlobStore(tmp_path / "theirs").put(data, sync=False) == ref


def test_same_files_as_the_blob_store(tmp_path):
    # A growing conversation, as an agent resends it: chunked, so the shared prefix is stored once.
    messages = [
        b'{"role": "user", "content": "%s"}' % hashlib.sha256(b"%d" % i).hexdigest().encode() * 40
        for i in range(41)
    ]
    turns = [b"[" + b"},{".join(messages[:n]) + b"]" for n in (40, 41)]
    w = writer(tmp_path)
    refs = [w.put(t) for t in turns]
    records, torn = read_records(w.pack.read_bytes(), "pack")
    assert torn is None and len({h for h, _ in records}) == len(records)  # the shared prefix appended once
    w.close()
    ref_store = BlobStore(tmp_path / "theirs")
    assert [ref_store.put(t, sync=False) for t in turns] == refs
    mine, theirs = stored_files(tmp_path / "blobs"), stored_files(tmp_path / "theirs")
    assert mine == theirs and len(mine) > 3  # the same blobs, chunk lists included
    assert len(records) == len(mine)


def test_resent_chunks_are_recognised_not_rehashed_and_files_stay_the_same(tmp_path, monkeypatch):
    """An image resent on every turn: its chunks come from the recent chunks (compared byte for
    byte), and the stored blobs are still exactly BlobStore's."""
    image = os.urandom(700_000).hex().encode()  # no delimiters: fixed-size chunks
    turns = [b'{"turn": %d, "image": "%s"}' % (i, image) for i in range(3)]
    w = writer(tmp_path)
    hashed: list[int] = []
    sha256 = hashlib.sha256

    def counting_sha256(data: bytes = b"") -> Any:
        hashed.append(len(data))
        return sha256(data)

    monkeypatch.setattr(hashlib, "sha256", counting_sha256)
    refs, hashes = [], []
    for t in turns:
        refs.append(w.put(t))
        hashes.append(len(hashed))
        hashed.clear()
    monkeypatch.undo()
    # The first turn hashes the body and its 6 chunks; later ones the body and their first chunk.
    assert hashes == [7, 2, 2]
    w.close()
    ref_store = BlobStore(tmp_path / "theirs")
    assert [ref_store.put(t, sync=False) for t in turns] == refs
    assert stored_files(tmp_path / "blobs") == stored_files(tmp_path / "theirs")


def test_recent_chunks_compare_every_byte_and_stay_within_their_limit():
    recent = RecentChunks(limit=3 * 10_000)
    a = b"x" * 32 + b"a" * 9_936 + b"y" * 32
    b = b"x" * 32 + b"b" * 9_936 + b"y" * 32  # the same length, head and tail: not the same chunk
    assert recent.address(memoryview(a)) == hashlib.sha256(a).hexdigest()
    assert recent.address(memoryview(b)) == hashlib.sha256(b).hexdigest()
    assert recent.address(memoryview(a)) == hashlib.sha256(a).hexdigest()
    for _i in range(10):
        c = os.urandom(10_000)
        assert recent.address(memoryview(c)) == hashlib.sha256(c).hexdigest()
    assert recent._bytes <= recent.limit and len(recent._chunks) == 3


def test_blobs_already_stored_are_not_appended_again(tmp_path):
    BlobStore(tmp_path / "blobs").put(b"B" * 100_000, sync=False)
    w = writer(tmp_path)
    w.put(b"B" * 100_000)
    assert read_records(w.pack.read_bytes(), "pack") == ([], None)
    w.close()


def test_threads_appending_at_once_leave_whole_records(tmp_path):
    w = writer(tmp_path)
    payloads = [os.urandom(5000 + i) for i in range(200)]
    refs: list = []
    threads = [
        threading.Thread(target=lambda part=payloads[i::4]: refs.extend(w.put(p) for p in part))
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records, torn = read_records(w.pack.read_bytes(), "pack")
    assert torn is None and len(records) == 200
    w.close()
    store = BlobStore(tmp_path / "blobs")
    assert sorted(store.get(r) for r in refs) == sorted(payloads)


def test_ingest_materialises_the_pack_of_a_recorder_that_died(tmp_path):
    """A recorder killed before closing leaves its blobs in the pack: ingest moves them into the
    store before the run's events become visible, reports a torn last record, and verify passes."""
    w = writer(tmp_path)
    kept = [w.put(b"request %d " % i * 50) for i in range(3)]
    with SpoolWriter(spool_path(tmp_path, "r", "recorder"), "r", "recorder") as recorder:
        recorder.append(RunStarted())  # (written before the agent starts; no run.finished came)
    with SpoolWriter(spool_path(tmp_path, "r", "proxy"), "r", "proxy") as spool:
        for ref in kept:
            spool.append(Note(text=ref.blob))
    w.sync()
    w.put(b"x" * 3000)  # the record being written when the process died ...
    os.close(w._fd)  # ... and no close(): the pack stays
    data = w.pack.read_bytes()
    w.pack.write_bytes(data[:-100])
    report = ingest(tmp_path)
    assert report.events_added == 4 and report.blobs_materialised == 3
    [torn] = report.torn
    assert torn.tail is not None
    assert (
        torn.path == "spool/r/proxy.blobs" and torn.frames == 3 and torn.tail.why == "incomplete blob record"
    )
    with Store.open(tmp_path, read_only=True) as st:
        assert [st.blobs.get(ref) for ref in kept] == [b"request %d " % i * 50 for i in range(3)]
        assert verify(st.con, st.blobs) == []


def test_a_damaged_pack_is_an_error_naming_it(tmp_path):
    with pytest.raises(SpoolError, match="p.blobs: not a blob pack"):
        read_records(b"garbage" * 20, "p.blobs")
    bad = MAGIC + b"zz" * 64 + b" 3\nabc"
    with pytest.raises(SpoolError, match="p.blobs: byte 11: not a blob record header"):
        read_records(bad, "p.blobs")
    assert read_records(MAGIC[:5], "p.blobs") == ([], 0)  # a header cut short is a torn tail


def test_sync_fsyncs_only_what_is_new(tmp_path):
    # The sink calls sync every group commit (every 20 ms): an idle pack must not be fsync'd each time.
    w = writer(tmp_path)
    assert w._unsynced is False
    w.put(b"one")
    assert w._unsynced is True
    w.sync()
    assert w._unsynced is False
    w.put(b"one")  # already appended: nothing new to make durable
    assert w._unsynced is False
    w.close()
