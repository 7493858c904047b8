"""Deltas: a request stored against the previous request of its run (``blobcodec.DELTA``)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import zstandard

from recorder.proxy.blobwriter import BlobWriter
from schemas import blobcodec, packstore
from schemas.blob import BlobRef, digest
from schemas.blobstore import DELTA_DEPTH, DELTA_READ_DEPTH, BlobStore
from schemas.blobverify import verify_many
from schemas.errors import BlobError


def conversation(turns: int, seed: int = 1) -> list[bytes]:
    """The request bodies of one chat: each resends every message so far, plus one or two new."""
    rng = random.Random(seed)
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a careful agent. " * 40}]
    out = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: " + rng.randbytes(300).hex()})
        out.append(json.dumps({"model": "m", "messages": messages, "tools": [{"name": "run"}]}).encode())
        messages.append({"role": "assistant", "content": f"done {turn} " + "ok " * rng.randint(5, 200)})
    return out


def depth_of(blobs: BlobStore, hexd: str) -> int:
    """How many deltas deep a stored blob is, following its bases."""
    depth = 0
    while (entry := blobs.entry(hexd)) is not None and entry.codec == blobcodec.DELTA:
        hexd = blobcodec.delta_base(blobs.read_record(hexd, entry)[1], hexd)
        depth += 1
    return depth


def codec_of(blobs: BlobStore, ref: BlobRef) -> int:
    entry = blobs.entry(ref.blob[7:])
    assert entry is not None
    return entry.codec


def stored_size(blobs: BlobStore) -> int:
    return sum(p.stat().st_size for p in blobs.pack_files())


def test_a_conversation_costs_its_new_content_and_reads_back(tmp_path):
    bodies = conversation(60)
    blobs = BlobStore(tmp_path / "delta")
    ref: BlobRef | None = None
    refs = []
    for body in bodies:
        ref = blobs.put(body, "application/json", sync=False, base=ref)
        refs.append(ref)
    whole = BlobStore(tmp_path / "whole")
    for body in bodies:
        whole.put(body, "application/json", sync=False)
    blobs.flush()
    whole.flush()
    # Each turn adds ~700 bytes of content (300 random bytes as hex): the deltas stay near that,
    # while whole bodies (chunked above 32 KiB) repeat the conversation again and again.
    assert stored_size(blobs) * 3 < stored_size(whole)
    assert stored_size(blobs) < 60 * 1200 + 12_000
    fresh = BlobStore(tmp_path / "delta")
    fresh.forget()
    assert [fresh.get(r) for r in refs] == bodies
    depths = [depth_of(fresh, r.blob[7:]) for r in refs]
    assert max(depths) == DELTA_DEPTH and depths[0] == 0  # chains are cut at DELTA_DEPTH
    assert sum(d > 0 for d in depths) > 50
    assert verify_many(fresh, [r.blob for r in refs]) == {}


def test_no_delta_where_it_does_not_pay_or_without_a_known_base(tmp_path):
    blobs = BlobStore(tmp_path)
    base = blobs.put(b'{"a": 1}' * 100)
    unrelated = os.urandom(2000)  # incompressible: stored raw, never as a delta
    r1 = blobs.put(unrelated, base=base)
    assert codec_of(blobs, r1) == blobcodec.RAW
    other = BlobStore(tmp_path)  # another writer never saw the base's content: no delta
    r2 = other.put(b'{"a": 1}' * 101, base=base)
    assert codec_of(blobs, r2) == blobcodec.ZSTD
    r3 = blobs.put(b'{"a": 1}' * 102, base=base)
    assert codec_of(blobs, r3) == blobcodec.DELTA
    assert blobs.get(r3) == b'{"a": 1}' * 102


def _edit_record(blobs: BlobStore, hexd: str, edit) -> None:
    entry = blobs.entry(hexd)
    assert entry is not None
    path = blobs.packs_dir / (entry.pack + packstore.PACK_SUFFIX)
    blobs.close()
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    edit(data, entry)
    path.write_bytes(bytes(data))
    blobs.forget()


def test_a_damaged_or_missing_base_fails_the_delta_by_name(tmp_path):
    bodies = conversation(4)
    blobs = BlobStore(tmp_path)
    refs: list[BlobRef] = []
    for body in bodies:
        refs.append(blobs.put(body, sync=False, base=refs[-1] if refs else None))
    blobs.flush()
    last = refs[-1].blob
    assert depth_of(blobs, last[7:]) == 3
    base_hex = refs[0].blob[7:]

    def flip_last_byte(data: bytearray, entry: packstore.Entry) -> None:
        data[entry.offset + entry.length - 1] ^= 0x01

    _edit_record(blobs, base_hex, flip_last_byte)
    with pytest.raises(BlobError, match="delta base failed") as e:
        blobs.get(last)
    assert base_hex in str(e.value)
    problems = verify_many(blobs, [r.blob for r in refs])
    assert set(problems) == {r.blob for r in refs}  # the base, and every delta built on it

    def rename_base(data: bytearray, entry: packstore.Entry) -> None:  # its record now names another blob
        data[entry.offset : entry.offset + 64] = b"f" * 64

    _edit_record(blobs, base_hex, rename_base)
    blobs.forget()
    with pytest.raises(BlobError, match="delta base failed"):
        blobs.get(refs[1])


def test_hostile_deltas_are_errors_not_hangs(tmp_path):
    blobs = BlobStore(tmp_path)
    frame = b"\x28\xb5\x2f\xfd" + b"\x00" * 8
    looping = bytes.fromhex(digest(b"loop")[7:])  # an address whose record names itself as its base
    hexd = looping.hex()
    blobs.put_stored(
        hexd, blobcodec.DELTA_MAGIC + bytes.fromhex(hexd) + frame, sync=False, codec=blobcodec.DELTA
    )
    with pytest.raises(BlobError, match=f"deeper than {DELTA_READ_DEPTH}"):
        blobs.get("sha256:" + hexd)
    bad = digest(b"bad header")[7:]
    blobs.put_stored(bad, blobcodec.DELTA_MAGIC + b"../../etc/passwd", sync=False, codec=blobcodec.DELTA)
    with pytest.raises(BlobError, match="a delta without its header"):
        blobs.get("sha256:" + bad)
    missing = digest(b"missing base")[7:]
    nowhere = digest(b"never stored")[7:]
    blobs.put_stored(missing, blobcodec.DELTA_MAGIC + bytes.fromhex(nowhere) + frame, sync=False)
    with pytest.raises(BlobError, match=f"{nowhere} is missing"):
        blobs.get("sha256:" + missing)
    # A frame that claims a huge size is refused before it is decompressed.
    base = blobs.put(b"x" * 100)
    huge = digest(b"huge")[7:]
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(b"\x00" * (1 << 20))
    bomb = bomb[:5] + b"\xff" * 8 + bomb[13:]  # a lying content size
    blobs.put_stored(huge, blobcodec.DELTA_MAGIC + bytes.fromhex(base.blob[7:]) + bomb, sync=False)
    with pytest.raises(BlobError, match="corrupted"):
        blobs.get("sha256:" + huge)


def test_the_proxy_writer_stores_deltas_that_the_store_reads(tmp_path: Path):
    bodies = conversation(20)
    root = tmp_path / "blobs"
    writer = BlobWriter(root, tmp_path / "spool" / "run" / "proxy.blobs")
    ref: BlobRef | None = None
    refs = []
    for body in bodies:
        ref = writer.put(body, "application/json", base=ref)
        refs.append(ref)
    writer.close()  # materialised into the store's packs
    blobs = BlobStore(root)
    blobs.forget()
    assert [blobs.get(r) for r in refs] == bodies
    assert sum(codec_of(blobs, r) == blobcodec.DELTA for r in refs) > 15
    assert verify_many(blobs, [r.blob for r in refs]) == {}


def _plain_delta(stored: bytes, base: bytes, size: int) -> bytes:
    """A delta applied with a decompressor made for its base: the plain path, the reference."""
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    frame = stored[blobcodec.DELTA_HEAD :]
    return zstandard.ZstdDecompressor(dict_data=dictionary).decompress(frame, max_output_size=size)


@pytest.mark.parametrize(
    "base",
    [
        b"x",  # a one-byte base
        os.urandom(300 * 1024),  # more than one stored block of 128 KiB
        blobcodec.ZSTD_DICT_MAGIC + os.urandom(5000),  # read as a formatted dictionary by zstd: plain path
    ],
    ids=["one byte", "three blocks", "dictionary magic"],
)
def test_a_delta_applied_on_the_shared_decompressor_is_the_plain_result(base):
    """``decode_delta`` applies a delta as a zstd content-dictionary chain on one reused
    decompressor; the content is the one the plain path (a decompressor per base) gives, and a
    damaged delta fails with the plain path's words."""
    content = base[: len(base) // 2] + b"new turn " * 50 + base[len(base) // 2 :]
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    frame = zstandard.ZstdCompressor(dict_data=dictionary, write_content_size=True).compress(content)
    stored = blobcodec.DELTA_MAGIC + bytes(32) + frame  # as encode_delta writes one, whatever its size
    assert (
        blobcodec.decode_delta(stored, base, 1 << 26, "a")
        == content
        == _plain_delta(stored, base, len(content))
    )
    cut = stored[:-3]
    with pytest.raises(BlobError, match="cannot apply its delta"):
        blobcodec.decode_delta(cut, base, 1 << 26, "a")
    # Another base gives other content, as the plain path does (no error: the address check sees it).
    other = bytes([base[0] ^ 1]) + base[1:]
    assert blobcodec.decode_delta(stored, other, 1 << 26, "a") == _plain_delta(stored, other, len(content))
