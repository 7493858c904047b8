"""The blob store: content addressing, write-once, chunked dedup, corruption detection."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import zlib

import pytest

from schemas import packstore
from schemas.blobchunks import _RESIDUES, CHUNK_ABOVE, MAX_CHUNK, MIN_CHUNK, chunk_bounds
from schemas.blobstore import CHUNK_MAGIC, BlobStore
from schemas.errors import BlobError
from tests.fakes.blob_tamper import remove_blob


def conversation(turns: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "You are a careful agent. " * 400}]
    for i in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": f"step {i} " + "".join(rng.choice("abcdef ") for _ in range(2000)),
            }
        )
        messages.append({"role": "tool", "content": "output " * rng.randint(50, 500)})
    return json.dumps({"model": "m", "messages": messages}).encode()


def test_round_trip_small_and_large(tmp_path):
    store = BlobStore(tmp_path)
    for data in (b"", b"x", os.urandom(CHUNK_ABOVE + 1), conversation(30), os.urandom(3 * MAX_CHUNK)):
        ref = store.put(data, "application/json")
        assert ref.blob == "sha256:" + hashlib.sha256(data).hexdigest() and ref.size == len(data)
        assert store.get(ref) == data


def test_growing_conversation_is_stored_once(tmp_path):
    store = BlobStore(tmp_path)
    requests = [conversation(turns) for turns in range(1, 41)]
    for r in requests:
        store.put(r)
    total = sum(len(r) for r in requests)
    assert store.stored_bytes() < total / 8, (store.stored_bytes(), total)
    assert all(store.get("sha256:" + hashlib.sha256(r).hexdigest()) == r for r in requests)


def test_bounds_are_prefix_stable_and_sized():
    data = conversation(60)
    bounds = chunk_bounds(data)
    assert bounds[-1] == len(data)
    sizes = [b - a for a, b in zip([0] + bounds, bounds, strict=False)]
    assert max(sizes) <= MAX_CHUNK
    longer = conversation(61)
    assert longer.startswith(data[: bounds[-3]])
    assert chunk_bounds(longer)[: len(bounds) - 2] == bounds[:-2]


def test_write_once_in_one_pack(tmp_path):
    store = BlobStore(tmp_path)
    ref = store.put(b"hello")
    store.put(b"hello")
    BlobStore(tmp_path).put(b"hello")  # another handle of the same process: the same pack
    (pack,) = store.pack_files()
    assert oct(pack.stat().st_mode & 0o777) == "0o444"
    assert [r.hexd for r in packstore.scan(pack)] == [ref.blob[len("sha256:") :]]
    assert list(store.loose_files()) == []


def test_missing_and_corrupted_chunks_are_errors(tmp_path):
    store = BlobStore(tmp_path)
    data = conversation(40)
    ref = store.put(data)
    entry = store.entry(ref.blob[len("sha256:") :])
    assert entry is not None and entry.codec == ord("c")
    listing = bytes(store.read_record(ref.blob[len("sha256:") :], entry)[1])
    assert listing.startswith(CHUNK_MAGIC)
    chunk = listing[len(CHUNK_MAGIC) :].splitlines()[1].decode()
    remove_blob(store, chunk)
    with pytest.raises(BlobError, match="a chunk failed: blob sha256:.* is missing"):
        store.get(ref)
    assert "missing" in (store.check(ref.blob) or "")


def test_loose_files_of_an_old_store_are_still_read(tmp_path):
    data, small = conversation(20), b'{"role": "user"}'
    write_loose(tmp_path, small)
    write_loose(tmp_path, data)
    store = BlobStore(tmp_path)
    assert store.get("sha256:" + hashlib.sha256(small).hexdigest()) == small
    assert store.get("sha256:" + hashlib.sha256(data).hexdigest()) == data
    assert store.pack_files() == []  # reading writes nothing


def write_loose(root, data: bytes) -> str:
    """A blob as stores before packs kept it: a zlib file, or a chunk list of zlib files."""

    def one(content: bytes, stored: bytes) -> str:
        hexd = hashlib.sha256(content).hexdigest()
        path = root / hexd[:2] / hexd[2:]
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_bytes(stored)
        return "sha256:" + hexd

    bounds = chunk_bounds(data) if len(data) > CHUNK_ABOVE else [len(data)]
    if len(bounds) == 1:
        return one(data, zlib.compress(data, 3))
    chunks, start = [], 0
    for end in bounds:
        chunks.append(one(data[start:end], zlib.compress(data[start:end], 3)))
        start = end
    return one(data, CHUNK_MAGIC + "".join(c + "\n" for c in chunks).encode())


def test_bad_address():
    with pytest.raises(BlobError, match="not a blob address"):
        BlobStore("/nonexistent").path_of("md5:abc")


def reference_bounds(data: bytes) -> list[int]:
    """The chunking rule written the obvious way (a regex over candidates), independently."""
    bounds, last = [], 0
    for match in re.finditer(rb"\n|\}, ?\{", data):
        cut = match.end()
        while cut - last > MAX_CHUNK:
            last += MAX_CHUNK
            bounds.append(last)
        if cut - last >= MIN_CHUNK and zlib.crc32(data[cut - 32 : cut]) % _RESIDUES == 0:
            bounds.append(cut)
            last = cut
    while len(data) - last > MAX_CHUNK:
        last += MAX_CHUNK
        bounds.append(last)
    if last < len(data):
        bounds.append(len(data))
    return bounds


def test_chunk_bounds_match_a_regex_formulation_of_the_rule():
    import json
    import random

    from schemas.blobchunks import chunk_bounds as fast

    rng = random.Random(7)
    cases = [b"", b"A" * (5 * 1024 * 1024), b"\n" * 300_000, b"},{" * 100_000, b"}, {" * 90_000]
    for _ in range(25):
        alphabet = rng.choice([b"}, {\na", b"},{ab", b"\n}{, xyz0123456789"])
        cases.append(bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 400_000))))
    for _ in range(10):
        msgs = [
            {"role": "user", "content": "".join(rng.choice("abc \n") for _ in range(rng.randint(10, 9000)))}
            for _ in range(rng.randint(1, 60))
        ]
        cases.append(
            json.dumps({"messages": msgs}, separators=(",", ":") if rng.random() < 0.5 else None).encode()
        )
    for data in cases:
        assert fast(data) == reference_bounds(data)
