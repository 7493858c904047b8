"""``amb blobs migrate``: move a store's loose blob files (``blobs/ab/cdef...``) into packs, every
content re-hashed; loose files go in batches, only once the records that replace them are fsync'd,
so a killed migration resumes (docs/blob-packs.md). A file that fails its check stays and is named.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from schemas import blobcodec
from schemas.blob import HASH_PREFIX
from schemas.blobstore import CHUNK_MAGIC, DECODE_LIMIT, BlobStore, read_loose
from schemas.errors import BlobError

BATCH_BYTES = 16 * 1024 * 1024
"""Loose bytes packed between two fsyncs (and removals of the files they replace)."""
LOCK = ".migrate.lock"


class Migrated(NamedTuple):
    packed: int
    """Loose blobs appended to a pack."""
    already: int
    """Loose blobs that a killed migration had packed already (their files removed now)."""
    bad: list[str]
    """Loose files that failed their check (left in place), each with its reason."""


def loose_content(blobs: BlobStore, path: Path, raw: bytes) -> bytes:
    """The content a loose file stands for, checked against its address (raises BlobError)."""
    address = HASH_PREFIX + path.parent.name + path.name
    if raw.startswith(CHUNK_MAGIC):
        data = b"".join(
            blobs.get(line.decode(errors="replace")) for line in raw[len(CHUNK_MAGIC) :].splitlines()
        )
    else:
        data = blobcodec.decode(blobcodec.ZLIB, raw, DECODE_LIMIT, address)
    if hashlib.sha256(data).hexdigest() != path.parent.name + path.name:
        raise BlobError(f"blob {address} is corrupted (content does not match its address)")
    return data


def migrate(blobs: BlobStore, progress: Callable[[int, int], None] | None = None) -> Migrated:
    blobs.root.mkdir(parents=True, exist_ok=True)
    with open(blobs.root / LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BlobError(f"another blob migration of {blobs.root} is running") from None
        return _migrate(blobs, progress)


def _migrate(blobs: BlobStore, progress: Callable[[int, int], None] | None) -> Migrated:
    files = list(blobs.loose_files())
    blobs.hold()
    packed = already = 0
    bad: list[str] = []
    pending: list[Path] = []
    pending_bytes = 0

    def commit() -> None:
        nonlocal pending_bytes
        blobs.flush()  # the records are durable before the files they replace go
        for p in pending:
            p.unlink(missing_ok=True)
        pending.clear()
        pending_bytes = 0

    for i, path in enumerate(files):
        if progress and i % 512 == 0:
            progress(i, len(files))
        hexd = path.parent.name + path.name
        address = HASH_PREFIX + hexd
        try:
            raw = read_loose(path, address)
            data = loose_content(blobs, path, raw)
        except FileNotFoundError:
            continue
        except BlobError as e:
            bad.append(f"{path.relative_to(blobs.root)}: {e}")
            continue
        if blobs.packed(hexd):
            reason = blobs.check(address)  # reads the packed copy
            if reason:
                bad.append(f"{path.relative_to(blobs.root)}: kept, its packed copy is damaged: {reason}")
                continue
            already += 1
        elif raw.startswith(CHUNK_MAGIC):
            blobs.put_stored(hexd, raw, sync=False)
            packed += 1
        else:
            codec, stored = blobcodec.encode(data)
            blobs.put_stored(hexd, stored, sync=False, codec=codec)
            packed += 1
        pending.append(path)
        pending_bytes += len(raw)
        if pending_bytes >= BATCH_BYTES:
            commit()
    commit()
    for shard in blobs.root.glob("[0-9a-f][0-9a-f]"):
        with contextlib.suppress(OSError):  # not empty: a file that failed its check stays
            for leftover in shard.glob(".tmp-*"):  # a loose writer killed mid-write
                leftover.unlink()
            shard.rmdir()
    if progress:
        progress(len(files), len(files))
    return Migrated(packed, already, bad)
