"""Blob packs: one read per blob, torn tails, several writers, hostile packs and indexes, codecs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import zlib

import pytest
import zstandard

from schemas import blobcodec, packstore
from schemas.blob import HASH_PREFIX
from schemas.blobstore import BlobStore
from schemas.blobverify import verify_many
from schemas.errors import BlobError
from tests.fakes.blob_tamper import replace_blob, set_entry


def address(data: bytes) -> str:
    return HASH_PREFIX + hashlib.sha256(data).hexdigest()


def png(size: int) -> bytes:
    """A real PNG of random pixels (already compressed; compresses no further)."""
    from PIL import Image

    side = int((size / 3) ** 0.5)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG")
    return out.getvalue()


def test_a_read_is_one_pread_of_its_index_entry_and_one_of_the_record(tmp_path, monkeypatch):
    store = BlobStore(tmp_path)
    bodies = [json.dumps({"i": i, "text": "word " * i}).encode() for i in range(300)]
    refs = [store.put(b, sync=False) for b in bodies]
    reader = BlobStore(tmp_path)
    reader.forget()
    calls: list[int] = []
    real = os.pread

    def counting_pread(fd: int, n: int, off: int) -> bytes:
        calls.append(n)
        return real(fd, n, off)

    monkeypatch.setattr(os, "pread", counting_pread)
    assert reader.get(refs[123]) == bodies[123]
    assert len(calls) == 2 and calls[0] == packstore.ENTRY.size and calls[1] < 200


def test_codecs_fit_the_content(tmp_path):
    store = BlobStore(tmp_path)
    body = json.dumps({"messages": [{"role": "user", "content": "segment the liver " * 50}]}).encode()
    image = png(200_000)
    noise = os.urandom(20_000)
    gz = gzip.compress(b"a NIfTI volume " * 20_000)  # .nii.gz: small, but gzip by its magic
    for data in (body, image, noise, gz):
        store.put(data)

    def codec_of(hexd: str) -> int:
        entry = store.entry(hexd)
        assert entry is not None
        return entry.codec

    def codec(data: bytes) -> int:
        return codec_of(address(data)[7:])

    assert codec(body) == blobcodec.ZSTD and codec(noise) == blobcodec.RAW and codec(gz) == blobcodec.RAW
    # the PNG is chunked (content-defined, as all large blobs): its list, then chunks stored raw
    assert codec(image) == blobcodec.CHUNKS
    entry = store.entry(address(image)[7:])
    assert entry is not None
    listing = bytes(store.read_record(address(image)[7:], entry)[1])
    chunks = [line.decode()[7:] for line in listing.splitlines()[1:]]
    assert chunks and all(codec_of(c) == blobcodec.RAW for c in chunks)
    assert blobcodec.looks_compressed(image) and blobcodec.looks_compressed(noise)
    assert not blobcodec.looks_compressed(body * 20)
    for data in (body, image, noise, gz):
        assert store.get(address(data)) == data


def test_torn_pack_and_index_tails_are_ignored(tmp_path):
    store = BlobStore(tmp_path)
    kept = [store.put(os.urandom(50) + bytes([i]), sync=False) for i in range(20)]
    store.close()
    (pack,) = store.pack_files()
    idx = pack.with_suffix(packstore.IDX_SUFFIX)
    os.chmod(pack, 0o644)
    os.chmod(idx, 0o644)
    with open(pack, "ab") as f:
        f.write(b"a" * 64 + b" s 900\npartial")  # a writer killed mid-record
    with open(idx, "ab") as f:
        f.write(b"\x01" * 20)  # and mid-entry
    reader = BlobStore(tmp_path)
    reader.forget()
    assert all(reader.check(r.blob) is None for r in kept)
    assert len(list(packstore.scan(pack))) == 20
    assert verify_many(reader, [r.blob for r in kept]) == {}


def test_writers_in_two_processes_write_their_own_packs(tmp_path):
    script = (
        "import sys; from schemas.blobstore import BlobStore\n"
        "s = BlobStore(sys.argv[1])\n"
        "for i in range(200): print(s.put(b'shared %d' % i + sys.argv[2].encode() * (i % 3)).blob)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path), tag], stdout=subprocess.PIPE, text=True
        )
        for tag in ("a", "b")
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    store = BlobStore(tmp_path)
    assert len(store.pack_files()) == 2
    assert verify_many(store, sorted(set(outs[0] + outs[1]))) == {}


def test_an_index_its_writer_has_only_just_created_holds_no_entries_yet(tmp_path):
    # A writer creates its index, then writes the magic: another process listing the packs in
    # between (or after a writer killed there) finds it empty or cut short, which is no entries.
    store = BlobStore(tmp_path)
    kept = store.put(b"kept")
    store.close()
    packs = store.pack_files()[0].parent
    for n, head in enumerate((b"", packstore.IDX_MAGIC[:4])):
        pack_id = packstore.new_pack_id() + str(n)
        (packs / (pack_id + packstore.PACK_SUFFIX)).write_bytes(packstore.PACK_MAGIC)
        (packs / (pack_id + packstore.IDX_SUFFIX)).write_bytes(head)
    reader = BlobStore(tmp_path)
    more = reader.put(b"more")
    assert [reader.get(r) for r in (kept, more)] == [b"kept", b"more"]
    assert verify_many(reader, [kept.blob, more.blob]) == {}
    assert packstore.read_index(packs / (pack_id + packstore.IDX_SUFFIX)) == ([], len(packstore.IDX_MAGIC))
    (packs / (pack_id + packstore.IDX_SUFFIX)).write_bytes(b"NOT AN INDEX")  # not one
    fresh = BlobStore(tmp_path)
    fresh.forget()  # what this process read of the packs: a new process reads them anew
    with pytest.raises(BlobError, match="bad magic"):
        fresh.put(b"third")


def test_killed_packer_loses_nothing_it_acknowledged(tmp_path):
    """kill -9 of a process mid-write: every blob whose put returned reads back intact."""
    script = (
        "import os, sys; from schemas.blobstore import BlobStore\n"
        "s = BlobStore(sys.argv[1])\n"
        "i = 0\n"
        "while True:\n"
        "    ref = s.put(os.urandom(3000) + b'{\"n\": %d}' % i * 200, sync=False)\n"
        "    print(ref.blob, flush=True)\n"
        "    i += 1\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acknowledged = [proc.stdout.readline().strip() for _ in range(400)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = BlobStore(tmp_path)
    assert verify_many(store, acknowledged) == {}


@pytest.fixture
def packed(tmp_path):
    store = BlobStore(tmp_path)
    data = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * i) for i in range(50)]
    refs = [store.put(d) for d in data]
    store.close()
    return store, refs, data


def test_index_pointing_outside_the_pack(packed):
    store, refs, _ = packed
    size = store.pack_files()[0].stat().st_size
    for offset, length in ((size + 10, 50), (size - 5, 50), (0, 50), (100, 0xFFFFFFFF), (100, 0)):
        set_entry(store, refs[3].blob, offset, length)
        with pytest.raises(
            BlobError, match=f"blob {refs[3].blob} is corrupted .*(outside the pack|no record)"
        ):
            store.get(refs[3])
    assert store.get(refs[4]) is not None  # the others still read


def test_index_with_a_lying_length_or_another_record(packed):
    store, refs, _ = packed
    entry = store.entry(refs[7].blob[7:])
    other = store.entry(refs[8].blob[7:])
    assert entry is not None and other is not None
    set_entry(store, refs[7].blob, entry.offset, entry.length - 1)
    with pytest.raises(BlobError, match=f"blob {refs[7].blob} .*wrong length"):
        store.get(refs[7])
    set_entry(store, refs[7].blob, other.offset, other.length)
    with pytest.raises(BlobError, match=f"blob {refs[7].blob} .*another blob's record"):
        store.get(refs[7])
    wrong = ord("z") if entry.codec != ord("z") else ord("s")
    set_entry(store, refs[7].blob, entry.offset, entry.length, codec=wrong)
    with pytest.raises(BlobError, match=f"blob {refs[7].blob} .*codec"):
        store.get(refs[7])


def test_records_with_a_hash_mismatch_or_a_bomb(packed):
    store, refs, _ = packed
    replace_blob(store, refs[1].blob, zstandard.ZstdCompressor().compress(b"other content"), blobcodec.ZSTD)
    with pytest.raises(BlobError, match=f"blob {refs[1].blob} is corrupted \\(content does not match"):
        store.get(refs[1])
    # a frame that claims more than any blob may hold is refused before it is expanded
    huge = zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * (70 << 20))
    replace_blob(store, refs[2].blob, huge, blobcodec.ZSTD)
    with pytest.raises(BlobError, match=f"blob {refs[2].blob} is corrupted \\(its zstd frame claims"):
        store.get(refs[2])
    zbomb = zlib.compress(b"\0" * (70 << 20))
    replace_blob(store, refs[5].blob, zbomb, blobcodec.ZLIB)
    with pytest.raises(BlobError, match=f"blob {refs[5].blob} is corrupted .*expands too far"):
        store.get(refs[5])
    bad = verify_many(store, [r.blob for r in refs])
    assert set(bad) == {refs[1].blob, refs[2].blob, refs[5].blob}


def test_a_chunk_list_naming_itself_is_an_error_not_a_loop(packed):
    store, refs, _ = packed
    listing = b"AMBCHUNKS 1\n" + refs[0].blob.encode() + b"\n"
    replace_blob(store, refs[0].blob, listing, blobcodec.CHUNKS)
    with pytest.raises(BlobError, match="a chunk is itself a chunk list"):
        store.get(refs[0])


def test_a_pack_that_is_not_a_pack(tmp_path):
    store = BlobStore(tmp_path)
    ref = store.put(b"x")
    store.close()
    (pack,) = store.pack_files()
    os.chmod(pack, 0o644)
    pack.write_bytes(b"GARBAGE!!!" + pack.read_bytes()[10:])
    with pytest.raises(BlobError, match="not a blob pack"):
        list(packstore.scan(pack))
    assert BlobStore(tmp_path).check(ref.blob) is None  # its record, read where the index says, is intact


def test_blobs_encode_and_decode_in_many_threads_at_once():
    # The scorer reads blobs from a thread pool: one zstd context shared by threads corrupts output
    # now and then ("Destination buffer is too small" on a sound blob, seen scoring a sweep).
    from concurrent.futures import ThreadPoolExecutor

    contents = [(b"%d {'role': 'user'} " % i) * (200 + 37 * i) for i in range(48)]

    def round_trip(data: bytes) -> bool:
        codec, stored = blobcodec.encode(data)
        assert codec == blobcodec.ZSTD
        return blobcodec.decode(codec, stored, len(data), address(data)) == data

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(round_trip, contents * 40))


def test_verify_of_a_growing_conversation_and_a_damaged_shared_chunk(tmp_path):
    """Requests that resend the conversation so far: their chunk lists share their leading chunks,
    whose hash states verify_many keeps and goes on from. Every list passes; then the chunk they all
    start with is damaged where reads find it (a sound copy stays earlier in the pack), and every
    list fails, as a read of it does."""
    import random

    store = BlobStore(tmp_path)
    rng = random.Random(1)
    turns = [json.dumps({"role": "user", "content": rng.randbytes(3000).hex()}) for _ in range(30)]
    bodies = [("[" + ",\n".join(turns[:k]) + "]").encode() for k in range(12, 31)]
    refs = [store.put(b) for b in bodies]
    store.close()
    listings = [bytes(store.stored_record(r.blob[7:])[1]) for r in refs]
    assert all(x.startswith(b"AMBCHUNKS 1\n") for x in listings)
    firsts = {x.split(b"\n")[1] for x in listings}
    assert len(firsts) == 1  # one shared leading chunk
    assert verify_many(store, [r.blob for r in refs]) == {}
    assert [hashlib.sha256(store.get(r)).hexdigest() for r in refs] == [r.blob[7:] for r in refs]
    shared = firsts.pop().decode()
    replace_blob(store, shared, zstandard.ZstdCompressor().compress(b"other"), blobcodec.ZSTD)
    bad = verify_many(store, [r.blob for r in refs])
    assert set(bad) == {r.blob for r in refs}
    assert all("a chunk failed" in reason for reason in bad.values())
    with pytest.raises(BlobError, match="a chunk failed"):
        store.get(refs[-1])
