"""Checking many blobs at once: one sequential pass over every pack of a blob store.

Every pack is read front to back once (sequential reads, no per-blob open or seek) and each
record's content re-hashed; a chunk list is hashed from the content of its chunks kept from the
same pass (a list follows its new chunks in a pack, and a conversation's older chunks are not far
behind; ``VERIFY_CACHE`` bytes are kept). A blob then passes if the index entry a read would use
lands exactly on a record that passed. Loose files and anything that did not pass are checked by
an ordinary read (``BlobStore.check``), which also words the error.

The pass (``verified_records``) does not need to know which blobs are asked about; only the
judging after it (``judge``) does, so ``amb verify`` starts the pass while the database is still
finding them (``replay.blob_pass``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from schemas import blobcodec, packstore
from schemas.blob import HASH_PREFIX
from schemas.blobstore import CHUNK_MAGIC, DECODE_LIMIT, BlobStore
from schemas.errors import BlobError

VERIFY_CACHE = 128 * 1024 * 1024
"""Bytes of verified chunk content the pass keeps to hash the chunk lists that follow."""

STATE_COST = 256
"""What one kept hash state is counted as (a sha256 object, roughly)."""

HASH_TAIL = 4096
"""Bytes at the end of a content hashed after its head state is taken (``_Head``). A delta's
content is mostly its base's: the next request of a conversation is the one before it with a
message added near its end (before the few closing fields, such as the tools)."""

_Head = tuple[int, Any]
"""(n, the sha256 state after a content's first n bytes): all but its last ``HASH_TAIL`` bytes."""


class Reads(Protocol):
    """Where a read of each packed blob goes, and which of those records the pass found sound: the
    pass's bookkeeping, which a big store keeps in a compact form (``replay.blob_pass``)."""

    def start(self, pack: str, offset: int = 0) -> None:
        """The pass goes on to this pack (its records from ``offset`` on follow, in the order of
        their offsets)."""

    def sound(self, rec: packstore.Record) -> bool:
        """This record of the pack started matched its address; returns whether a read of
        ``rec.hexd`` goes to this record (one look-up for both: the pass asks both of every record)."""

    def unvouched(self, addresses: Iterable[str]) -> Iterator[str]:
        """Those of ``addresses`` whose read does not land exactly on a record the pass found sound."""


class IndexReads:
    """``Reads`` kept in the blob store's own index and a dict of the sound records."""

    def __init__(self, blobs: BlobStore):
        blobs.refresh()  # the index as it is now, packs written by other processes included
        self.blobs, self.pack = blobs, ""
        self.good: dict[tuple[str, int], tuple[int, int, str]] = {}
        """(pack, offset) -> (length, codec, hex address) of each sound record."""

    def start(self, pack: str, offset: int = 0) -> None:
        self.pack = pack

    def sound(self, rec: packstore.Record) -> bool:
        self.good[(self.pack, rec.offset)] = (rec.length, rec.codec, rec.hexd)
        indexed = self.blobs.entry(rec.hexd)
        return indexed is not None and (indexed.pack, indexed.offset) == (self.pack, rec.offset)

    def unvouched(self, addresses: Iterable[str]) -> Iterator[str]:
        for address in addresses:
            hexd = address[len(HASH_PREFIX) :]
            e = self.blobs.entry(hexd)
            if e is None or self.good.get((e.pack, e.offset)) != (e.length, e.codec, hexd):
                yield address


def verify_many(
    blobs: BlobStore, addresses: list[str], progress: Callable[[int, int], None] | None = None
) -> dict[str, str]:
    """The reason for each of ``addresses`` that is missing or damaged: by the pass over every
    pack, or, for a few blobs of a big store, by reading just those."""
    if len(addresses) * 20 < len(blobs.addresses()):  # (addresses() reads the index first)
        return _problems(blobs, addresses)
    reads = IndexReads(blobs)
    verified_records(blobs, reads, progress)
    return judge(blobs, addresses, reads)


Span = tuple[str, int, int | None]
"""Part of a pack: (its file name, the offset its first record starts at, the offset no record of
the span starts at or after, or None for the pack's end)."""


def verified_records(
    blobs: BlobStore,
    reads: Reads,
    progress: Callable[[int, int], None] | None = None,
    spans: list[Span] | None = None,
    cache: int = VERIFY_CACHE,
) -> None:
    """The pass over every pack (or the ``spans`` of them), before it is known which blobs are
    asked about: every sound record told to ``reads``."""
    if spans is None:
        spans = [(path.name, 0, None) for path in blobs.pack_files()]
    sizes = [span_size(blobs, span) for span in spans]
    total = sum(sizes) or 1
    chunks = _ContentCache(cache)
    done = 0
    for (name, start, stop), size in zip(spans, sizes, strict=True):
        reads.start(name[: -len(packstore.PACK_SUFFIX)], start)
        try:
            for rec in packstore.scan(blobs.packs_dir / name, start=start, stop=stop):
                _record_passes(blobs, reads, rec, chunks)
                if progress and rec.offset >> 23 != (rec.offset - rec.length) >> 23:
                    progress(min(done + rec.offset - start, total), total)  # every 8 MiB
        except (BlobError, FileNotFoundError):
            pass  # a malformed or vanished pack: its blobs fail the reads below, by name
        done += size
        if progress:
            progress(min(done, total), total)


def span_size(blobs: BlobStore, span: Span) -> int:
    name, start, stop = span
    try:
        end = (blobs.packs_dir / name).stat().st_size
    except FileNotFoundError:
        return 0
    return max(min(end, stop if stop is not None else end) - start, 0)


def _record_passes(blobs: BlobStore, reads: Reads, rec: packstore.Record, chunks: _ContentCache) -> None:
    """Whether one pack record's content matches its address (told to ``reads``); a sound chunk is
    kept for the lists that follow."""
    if rec.codec == blobcodec.CHUNKS:
        if _list_hash(rec.stored, chunks) == rec.hexd:
            reads.sound(rec)
        return
    try:
        data, base_hex = _decode_seen(blobs, rec, chunks)
    except BlobError:
        return
    if len(data) <= HASH_TAIL:  # (most records: no head worth keeping)
        sha, head = hashlib.sha256(data), None
    else:
        sha, head = _content_hash(data, base_hex, chunks)
    if sha.hexdigest() != rec.hexd:
        return
    if reads.sound(rec):
        # Only the copy a read would use stands for the chunk: a sound second copy must not vouch
        # for lists whose reads go to a damaged one.
        chunks.put(rec.hexd, data, head)


def _content_hash(data: bytes, base_hex: str | None, chunks: _ContentCache) -> tuple[Any, _Head]:
    """The sha256 of a record's content, and its ``_Head``. A delta whose content starts with the
    head of its base's content (kept from the pass) is hashed on from the base's head state:
    most of a conversation's next request is the one before it, hashed already."""
    view = memoryview(data)
    cut = max(len(data) - HASH_TAIL, 0)
    base = chunks.hashed(base_hex) if base_hex else None
    if base is not None and base[1][0] <= cut and data.startswith(memoryview(base[0])[: base[1][0]]):
        (start, state) = base[1]
        sha = state.copy()
        sha.update(view[start:cut])
    else:
        sha = hashlib.sha256(view[:cut])
    head = (cut, sha.copy())
    sha.update(view[cut:])
    return sha, head


def judge(blobs: BlobStore, addresses: Iterable[str], reads: Reads) -> dict[str, str]:
    """The problem with each of ``addresses`` that the pass did not vouch for (a blob passes if the
    read of it lands exactly on a record that passed), worded by an ordinary read."""
    return _problems(blobs, reads.unvouched(addresses))


def _problems(blobs: BlobStore, addresses: Iterable[str]) -> dict[str, str]:
    found = {a: blobs.check(a) for a in addresses}
    return {a: r for a, r in found.items() if r}


def _decode_seen(blobs: BlobStore, rec: packstore.Record, seen: _ContentCache) -> tuple[bytes, str | None]:
    """A record's content during the pass, and for a delta its base's address. A delta is built on
    its base's content, verified earlier in the pass, or else read (and re-hashed) now and kept for
    the deltas that follow (a base that is a chunk list is hashed in the pass, not kept whole)."""
    if rec.codec == blobcodec.RAW:
        return rec.stored, None  # (the most common record, taken first)
    if rec.codec != blobcodec.DELTA:
        return blobcodec.decode(rec.codec, rec.stored, DECODE_LIMIT, rec.hexd), None
    base_hex = blobcodec.delta_base(rec.stored, rec.hexd)
    base = seen.get(base_hex)
    if base is None:
        base = blobs.get(HASH_PREFIX + base_hex)
        seen.put(base_hex, base)
    return blobcodec.decode_delta(rec.stored, base, DECODE_LIMIT, rec.hexd), base_hex


def _list_hash(listing: bytes, chunks: _ContentCache) -> str | None:
    """The sha256 of a chunk list's content from chunks verified earlier in this pass (None if
    one is not at hand: the list is then checked by an ordinary read).

    The lists of one conversation share their leading chunks (each request resends the one
    before it), so the hash state after each prefix of a list is kept (``chunks.states``) and
    a later list with the same leading lines goes on from the longest one kept, instead of
    hashing the whole conversation again: linear in the chunks, not quadratic."""
    if not listing.startswith(CHUNK_MAGIC):
        return None
    ends, pos = [], len(CHUNK_MAGIC)
    while pos < len(listing):
        nl = listing.find(b"\n", pos)
        pos = len(listing) if nl == -1 else nl + 1
        ends.append(pos)
    # The longest prefix (whole lines) already hashed: prefixes are kept for every line of
    # every list, so the set kept is closed under shorter prefixes (bar evictions) and a
    # binary search finds it.
    lo, hi = 0, len(ends) - 1  # ends[lo - 1] is known, ends[hi + 1] is not
    states = chunks.states
    while lo <= hi:
        mid = (lo + hi) // 2
        if listing[: ends[mid]] in states:
            lo = mid + 1
        else:
            hi = mid - 1
    if lo:
        sha = states[listing[: ends[lo - 1]]].copy()
        start = ends[lo - 1]
    else:
        sha, start = hashlib.sha256(), len(CHUNK_MAGIC)
    for end in ends[lo:]:
        line = listing[start:end].rstrip(b"\n")
        if line:
            data = chunks.get(line[len(HASH_PREFIX) :].decode(errors="replace"))
            if data is None:
                return None
            sha.update(data)
        chunks.keep_state(listing[:end], sha)
        start = end
    return str(sha.hexdigest())


class _ContentCache:
    """Verified contents by address, least recently used dropped first past ``limit`` bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self.size = 0
        self._data: OrderedDict[str, bytes] = OrderedDict()
        self._heads: dict[str, _Head] = {}
        """The head state of a content kept, if the pass hashed it (``_content_hash``)."""
        self.states: OrderedDict[bytes, Any] = OrderedDict()
        """sha256 states after a prefix of a chunk list (by the prefix's bytes), least recent first."""

    def keep_state(self, prefix: bytes, sha: Any) -> None:
        if prefix not in self.states:
            self.states[prefix] = sha.copy()
            self.size += len(prefix) + STATE_COST
            if self.size > self.limit:
                self._evict()

    def _evict(self) -> None:
        """Drop the least recent down to seven eighths of the limit (so that most puts drop none)."""
        keep, size = self.limit - self.limit // 8, self.size
        contents, states, heads = self._data, self.states, self._heads
        while size > keep and (contents or states):
            if states and (not contents or len(states) > len(contents)):
                old, _ = states.popitem(last=False)
                size -= len(old) + STATE_COST
            else:
                hexd, data = contents.popitem(last=False)
                size -= len(data) + (STATE_COST if heads.pop(hexd, None) else 0)
        self.size = size

    def put(self, hexd: str, data: bytes, head: _Head | None = None) -> None:
        if hexd in self._data:
            return
        self._data[hexd] = data
        self.size += len(data)
        if head is not None:
            self._heads[hexd] = head
            self.size += STATE_COST
        if self.size > self.limit:
            self._evict()

    def hashed(self, hexd: str) -> tuple[bytes, _Head] | None:
        """A content kept and its head state, if the pass hashed it."""
        head = self._heads.get(hexd)
        data = self._data.get(hexd) if head is not None else None
        return None if data is None or head is None else (data, head)

    def get(self, hexd: str) -> bytes | None:
        data = self._data.get(hexd)
        if data is not None:
            self._data.move_to_end(hexd)
        return data
