"""The blob store: content addressing, write-once, chunked dedup, corruption detection."""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest

from schemas.blobstore import CHUNK_ABOVE, CHUNK_MAGIC, MAX_CHUNK, BlobStore, chunk_bounds
from schemas.errors import BlobError


def conversation(turns: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "You are a careful agent. " * 400}]
    for i in range(turns):
        messages.append({"role": "assistant", "content": f"step {i} " + "".join(rng.choice("abcdef ") for _ in range(2000))})
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
    sizes = [b - a for a, b in zip([0] + bounds, bounds)]
    assert max(sizes) <= MAX_CHUNK
    longer = conversation(61)
    assert longer.startswith(data[: bounds[-3]])
    assert chunk_bounds(longer)[: len(bounds) - 2] == bounds[:-2]


def test_write_once(tmp_path):
    store = BlobStore(tmp_path)
    ref = store.put(b"hello")
    path = store.path_of(ref.blob)
    assert not os.access(path, os.W_OK) or os.geteuid() == 0
    assert oct(path.stat().st_mode & 0o777) == "0o444"
    store.put(b"hello")
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == 1


def test_missing_and_corrupted_chunks_are_errors(tmp_path):
    store = BlobStore(tmp_path)
    data = conversation(40)
    ref = store.put(data)
    listing = store.path_of(ref.blob).read_bytes()
    assert listing.startswith(CHUNK_MAGIC)
    chunk = listing[len(CHUNK_MAGIC):].splitlines()[1].decode()
    os.remove(store.path_of(chunk))
    with pytest.raises(BlobError, match="a chunk failed: blob sha256:.* is missing"):
        store.get(ref)
    assert "missing" in store.check(ref.blob)


def test_bad_address():
    with pytest.raises(BlobError, match="not a blob address"):
        BlobStore("/nonexistent").path_of("md5:abc")
