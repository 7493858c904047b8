"""Tampering with stored blobs, wherever they live (a pack record or a loose file), for the tests
that show tampering is caught: what an attacker who can write the store directory could do."""

from __future__ import annotations

import os

from schemas import packstore
from schemas.blob import HASH_PREFIX
from schemas.blobstore import BlobStore


def _rewrite_index(blobs: BlobStore, pack: str, hexd: str, new: tuple[int, int, int] | None) -> None:
    idx = blobs.packs_dir / (pack + packstore.IDX_SUFFIX)
    entries, _ = packstore.read_index(idx)
    out = bytearray(packstore.IDX_MAGIC)
    for h, offset, length, codec in entries:
        if h == hexd:
            if new is None:
                continue
            offset, length, codec = new
        out += packstore.ENTRY.pack(bytes.fromhex(h), offset, length, codec)
    os.chmod(idx, 0o644)
    idx.write_bytes(bytes(out))


def remove_blob(blobs: BlobStore, address: str) -> None:
    """Make the blob unreachable: its loose file deleted, or its index entries dropped."""
    hexd = address[len(HASH_PREFIX) :]
    loose = blobs.path_of(address)
    if loose.exists():
        loose.unlink()
    blobs.refresh()
    for idx in sorted(blobs.packs_dir.glob("*" + packstore.IDX_SUFFIX)):
        _rewrite_index(blobs, idx.stem, hexd, None)
    _forget(blobs)


def replace_blob(blobs: BlobStore, address: str, stored: bytes, codec: int = ord("z")) -> None:
    """Give the blob other stored bytes: its loose file rewritten, or a new record of the same
    address appended to its pack and its index entry pointed at it."""
    hexd = address[len(HASH_PREFIX) :]
    loose = blobs.path_of(address)
    if loose.exists():
        os.chmod(loose, 0o644)
        loose.write_bytes(stored)
        return
    blobs.refresh()
    entry = blobs.entry(hexd)
    assert entry is not None, f"{address} is not stored"
    pack = blobs.packs_dir / (entry.pack + packstore.PACK_SUFFIX)
    os.chmod(pack, 0o644)
    offset = pack.stat().st_size
    record = packstore.record_bytes(hexd, codec, stored)
    with open(pack, "ab") as f:
        f.write(record)
    _rewrite_index(blobs, entry.pack, hexd, (offset, len(record), codec))
    _forget(blobs)


def set_entry(blobs: BlobStore, address: str, offset: int, length: int, codec: int | None = None) -> None:
    """Point the blob's index entry anywhere (a hostile index)."""
    hexd = address[len(HASH_PREFIX) :]
    blobs.refresh()
    entry = blobs.entry(hexd)
    assert entry is not None
    _rewrite_index(blobs, entry.pack, hexd, (offset, length, entry.codec if codec is None else codec))
    _forget(blobs)


def _forget(blobs: BlobStore) -> None:
    """Drop what this process has read of the index, so the next read sees the tampered one."""
    blobs.forget()
