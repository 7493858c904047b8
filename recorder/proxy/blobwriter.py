"""The proxy's blob writer: the blob store's format, appended to a pack while the agent waits.

It produces exactly what ``schemas.blobstore.BlobStore.put`` produces, but appends each blob to this
run's pack (``schemas.blobpack``: one ``writev``, no new inode, whose kernel time is the cost) and
materialises the pack into the blob store when the sink closes (``amb ingest`` does it for a run whose
recorder died first). Addresses already stored are remembered, so a body sent again costs a hash and
a set lookup, and a recent chunk a comparison (``RecentChunks``); a small new body is not looked up
in the store at all (materialising skips what already exists).
"""

from __future__ import annotations

import hashlib
import os
import threading
import zlib
from collections import OrderedDict
from pathlib import Path

from schemas.blob import HASH_PREFIX, BlobRef
from schemas.blobchunks import CHUNK_ABOVE, chunk_bounds
from schemas.blobpack import MAGIC, materialise, record_header
from schemas.blobstore import CHUNK_MAGIC, COMPRESSION_LEVEL, BlobStore, DeltaBases
from schemas.errors import BlobError

KNOWN_MAX = 1 << 16
"""Addresses remembered as stored (about 100 bytes each); the set is cleared when it fills up."""

LOOKUP_ABOVE = 4 * 1024
"""A new blob at most this big is not looked up in the store before it is appended."""

YIELD_EVERY = 256 * 1024
"""Bytes hashed between two offers of the CPU (~0.13 ms of hashing)."""

RECENT_CHUNK_BYTES = 32 * 1024 * 1024
"""How many bytes of recently stored chunks are kept, to recognise them without hashing them."""


class BlobWriter:
    def __init__(self, root: Path, pack: Path):
        self.store = BlobStore(root)
        self.store.root.mkdir(parents=True, exist_ok=True)
        # A writer for the whole run: it dedups against stored blobs, which gc --blobs must not
        # drop before this run's events are in its spool. Reads the index now, off the calls' path.
        self.store.hold()
        self.pack = Path(pack)
        self.pack.parent.mkdir(parents=True, exist_ok=True)
        self._known: set[str] = set()
        self._recent = RecentChunks(RECENT_CHUNK_BYTES)
        self._lock = threading.Lock()
        """One record at a time in the pack (the sink writes from the event loop and workers)."""
        self._unsynced = False
        """Whether records were appended since the last ``sync``."""
        self._bases = DeltaBases()
        self._bases_lock = threading.Lock()
        self._fd = os.open(self.pack, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if os.fstat(self._fd).st_size == 0:
            os.write(self._fd, MAGIC)

    def put(
        self, data: bytes, media_type: str = "application/octet-stream", base: BlobRef | None = None
    ) -> BlobRef:
        """Store ``data`` once, as ``BlobStore.put`` does (chunked, or a delta against ``base``).

        The whole body's hash comes first, on the calling thread (a body stored already then costs
        that one hash): a second thread would compete with mitmproxy and the upstream for the CPU."""
        hexd = _sha256_yielding(data)
        ref = BlobRef(blob=HASH_PREFIX + hexd, size=len(data), media_type=media_type)
        if hexd in self._known or (len(data) > LOOKUP_ABOVE and self._stored(hexd)):
            return ref
        with self._bases_lock:
            delta = self._bases.delta(data, base)
            self._bases.keep(hexd, data, delta[1] if delta else 0)
        if delta is not None:
            self._append(hexd, delta[0])
        elif len(data) > CHUNK_ABOVE:
            self._append(hexd, self._chunk_list(data))
        else:
            self._append(hexd, zlib.compress(data, COMPRESSION_LEVEL))
        return ref

    def _chunk_list(self, data: bytes) -> bytes:
        view, start, addresses = memoryview(data), 0, []
        for end in chunk_bounds(data):
            addresses.append(self._put_chunk(view[start:end]))
            start = end
        return CHUNK_MAGIC + "".join(a + "\n" for a in addresses).encode()

    def _put_chunk(self, chunk: memoryview) -> str:
        hexd = self._recent.address(chunk)
        if hexd not in self._known and not self._stored(hexd):
            self._append(hexd, zlib.compress(chunk, COMPRESSION_LEVEL))
        return HASH_PREFIX + hexd

    def _stored(self, hexd: str) -> bool:
        try:
            found = self.store.has(hexd)
        except OSError as e:
            raise BlobError(f"cannot look up blob {HASH_PREFIX}{hexd}: {e}") from e
        if found:
            self._remember(hexd)
        return found

    def _remember(self, hexd: str) -> None:
        if len(self._known) >= KNOWN_MAX:
            self._known.clear()
        self._known.add(hexd)

    def _append(self, hexd: str, stored: bytes) -> None:
        header = record_header(hexd, len(stored))
        try:
            with self._lock:
                written = os.writev(self._fd, [header, stored])
                self._unsynced = True
        except OSError as e:
            raise BlobError(f"cannot write blob {HASH_PREFIX}{hexd} to {self.pack.name}: {e}") from e
        if written != len(header) + len(stored):  # a short write to a regular file: the disk is full
            raise BlobError(f"cannot write blob {HASH_PREFIX}{hexd} to {self.pack.name}: short write")
        self._remember(hexd)

    def sync(self) -> None:
        """Make every blob appended so far durable (before the spool events that refer to them)."""
        with self._lock:
            if not self._unsynced:
                return
            self._unsynced = False  # appends during the fsync below set it again
        os.fsync(self._fd)

    def close(self) -> None:
        """Materialise the pack into the blob store, durably, then remove it."""
        if self._fd < 0:
            return
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        materialise(self.pack, self.store)
        self.pack.unlink()


def _sha256_yielding(data: bytes) -> str:
    """sha256 of ``data`` (hex), in ``YIELD_EVERY`` pieces, offering the CPU after each one: a
    thread woken meanwhile (the upstream reading the request) runs first instead of waiting for the
    hash's time slice; the address is needed only once the upstream has answered."""
    if len(data) <= YIELD_EVERY:
        return hashlib.sha256(data).hexdigest()
    sha, view = hashlib.sha256(), memoryview(data)
    for start in range(0, len(data), YIELD_EVERY):
        sha.update(view[start : start + YIELD_EVERY])
        os.sched_yield()
    return sha.hexdigest()


class RecentChunks:
    """The chunks most recently hashed (up to ``limit`` bytes, least recently used dropped first).
    An agent resends its whole conversation on every call, so most chunks of a large request are
    chunks of the previous one: comparing one with the kept copy is far cheaper than hashing it."""

    def __init__(self, limit: int):
        self.limit = limit
        self._chunks: OrderedDict[tuple[int, bytes, bytes], tuple[bytes, str]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        """The sink's workers and the event loop store blobs at the same time."""

    def address(self, chunk: memoryview) -> str:
        """The chunk's sha256 (hex)."""
        key = (len(chunk), bytes(chunk[:32]), bytes(chunk[-32:]))  # cheap to build, rarely shared
        with self._lock:
            kept = self._chunks.get(key)
            if kept is not None:
                self._chunks.move_to_end(key)
        # Same length, so ``startswith`` is equality (and takes the memoryview without a copy).
        if kept is not None and kept[0].startswith(chunk):
            return kept[1]
        hexd = hashlib.sha256(chunk).hexdigest()
        copy = bytes(chunk)
        with self._lock:
            old = self._chunks.pop(key, None)
            self._bytes += len(copy) - (len(old[0]) if old is not None else 0)
            self._chunks[key] = (copy, hexd)
            while self._bytes > self.limit:
                _, (dropped, _) = self._chunks.popitem(last=False)
                self._bytes -= len(dropped)
        return hexd
