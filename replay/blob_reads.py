"""The blob pass's bookkeeping for a big store, in arrays (``schemas.blobverify.Reads``).

The pass must know, for each record it finds sound, whether a read of that blob goes to it, and
then, for each blob asked about, whether its read lands on a sound record. The blob store's own
index is a dict (several hundred bytes a blob, a gigabyte for the two million blobs of a year of
sweeps); here the entries that reads use are arrays sorted by address (about 50 bytes a blob) and a
flag each, set when the pass finds its record sound. A pack's records come in the order of their
offsets, so the entries of that pack are walked beside them in the same order (no lookup per
record).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import numpy as np

from schemas import packstore
from schemas.blob import DIGEST_RE, HASH_PREFIX
from schemas.blobstore import BlobStore
from schemas.blobverify import Span

ENTRY = np.dtype([("digest", "V32"), ("offset", ">u8"), ("length", ">u4"), ("codec", "u1")])
"""An index entry as the file holds it (``packstore.ENTRY``)."""
assert ENTRY.itemsize == packstore.ENTRY.size

WALK = 1 << 16
"""Entries of a pack turned into Python values at a time while its records are walked."""

_Walked = tuple[int, str, int, int, int]
"""An entry of the pack walked: (offset, hex address, position in the table, length, codec)."""


class ArrayReads:
    """Where a read of each packed blob goes, as the blob store resolves it (the last entry for an
    address, of the packs' indexes in the order of their names), and which of those the pass found
    sound. Built from the index files as they are when the pass starts."""

    def __init__(self, blobs: BlobStore):
        names = _index_names(blobs.packs_dir)
        entries, packs = [], []
        for number, name in enumerate(names):
            try:
                data, _ = packstore.index_bytes(blobs.packs_dir / name)
            except (OSError, ValueError):
                continue  # vanished or not an index: its blobs fail the ordinary reads, by name
            entries.append(np.frombuffer(data, ENTRY))
            packs.append(np.full(len(entries[-1]), number, np.uint32))
        # (one index is read where it lies: a copy of it would be the build's largest allocation)
        table = (
            entries[0] if len(entries) == 1 else np.concatenate(entries) if entries else np.empty(0, ENTRY)
        )
        pack = packs[0] if len(packs) == 1 else np.concatenate(packs) if packs else np.empty(0, np.uint32)
        del entries, packs
        order, distinct = _by_digest(table)
        if not distinct:  # the last entry for each address is the one reads use
            ranked = table["digest"][order]
            last = np.ones(len(order), bool)
            last[:-1] = ranked[1:] != ranked[:-1]
            del ranked
            order = order[last]
        self.table, self.pack = table[order], pack[order]
        del table, pack, order
        self.ok = np.zeros(len(self.table), bool)
        self._numbers = {name[: -len(packstore.IDX_SUFFIX)]: n for n, name in enumerate(names)}
        self._walk: Iterator[_Walked] = iter(())
        self._next: _Walked | None = None

    def start(self, pack: str, offset: int = 0) -> None:
        number = self._numbers.get(pack)
        mine = np.flatnonzero(self.pack == number) if number is not None else np.empty(0, np.intp)
        offsets = self.table["offset"][mine]
        mine = mine[offsets >= offset]  # (the records before ``offset`` are another pass's)
        mine = mine[np.argsort(offsets[offsets >= offset], kind="stable")]
        self._walk = self._entries(mine)
        self._next = next(self._walk, None)

    def _entries(self, positions: np.ndarray) -> Iterator[_Walked]:
        """The given entries as Python values, a slice at a time (a record's look-up is then a
        comparison of plain values: reading each field out of the array cost more than the rest
        of the pass's bookkeeping)."""
        for i in range(0, len(positions), WALK):
            at = positions[i : i + WALK]
            rows = self.table[at]
            hexes = rows["digest"].tobytes().hex()
            yield from zip(
                rows["offset"].tolist(),
                [hexes[j : j + 64] for j in range(0, len(hexes), 64)],
                at.tolist(),
                rows["length"].tolist(),
                rows["codec"].tolist(),
                strict=True,
            )

    def sound(self, rec: packstore.Record) -> bool:
        walked = self._next
        while walked is not None and walked[0] < rec.offset:
            walked = next(self._walk, None)
        self._next = walked
        if walked is None or walked[0] != rec.offset or walked[1] != rec.hexd:
            return False  # a read of this address goes to another record
        if walked[3] == rec.length and walked[4] == rec.codec:
            self.ok[walked[2]] = True
        return True

    def unvouched(self, addresses: Iterable[str]) -> Iterator[str]:
        batch: list[str] = []
        for address in addresses:
            batch.append(address)
            if len(batch) == WALK:
                yield from self._unvouched(batch)
                batch = []
        yield from self._unvouched(batch)

    def _unvouched(self, addresses: list[str]) -> list[str]:
        digests = [bytes.fromhex(a[len(HASH_PREFIX) :]) if DIGEST_RE.match(a) else b"" for a in addresses]
        if not self.table.size or any(len(d) != 32 for d in digests):
            return addresses  # (not all addresses: each is read the ordinary way, which words it)
        good = self._vouched(np.frombuffer(b"".join(digests), "V32"))
        return [a for a, g in zip(addresses, good.tolist(), strict=True) if not g]

    def unvouched_digests(self, digests: bytes) -> bytes:
        """Those of the 32-byte ``digests`` (one after another) whose read does not land exactly on
        a record the pass found sound."""
        wanted = np.frombuffer(digests, "V32")
        return wanted[~self._vouched(wanted)].tobytes() if self.table.size else digests

    def _vouched(self, wanted: np.ndarray) -> np.ndarray:
        known = self.table["digest"]
        at = np.minimum(np.searchsorted(known, wanted), len(known) - 1)
        return (known[at] == wanted) & self.ok[at]  # type: ignore[no-any-return]


def _by_digest(records: np.ndarray) -> tuple[np.ndarray, bool]:
    """The order that sorts records (contiguous, each starting with its digest) by digest, an
    address's entries staying in file order, and whether the digests are all distinct: by their
    first eight bytes, a quarter of the time of sorting whole digests, unless two share them (an
    address stored twice, or a damaged index), when whole digests decide."""
    digests = records["digest"] if records.dtype.names else records
    if len(records) < 2:
        return np.arange(len(records)), True
    first = np.ndarray((len(records),), ">u8", records, 0, (records.itemsize,))
    order = np.argsort(first, kind="stable")
    ranked = first[order]
    if bool((ranked[1:] == ranked[:-1]).any()):
        return np.argsort(digests, kind="stable"), False
    return order, True


def _index_names(packs: os.PathLike[str]) -> list[str]:
    """The pack indexes, in the order the blob store reads them (a later entry wins)."""
    try:
        return sorted(n for n in os.listdir(packs) if n.endswith(packstore.IDX_SUFFIX))
    except FileNotFoundError:
        return []


def split(blobs: BlobStore, parts: int) -> list[list[Span]]:
    """The packs cut into ``parts`` spans of about the same number of bytes, each cut where a
    record starts (an offset of the pack's index), for passes that run side by side.

    A cut at an offset that a damaged index gives wrongly costs time, not soundness: the pass that
    starts there fails at once, and the blobs of its span are read the ordinary way."""
    packs = []
    for path in blobs.pack_files():
        try:
            packs.append((path.name, path.stat().st_size))
        except FileNotFoundError:
            continue  # collected meanwhile: its blobs fail the ordinary reads, by name
    total = sum(size for _, size in packs)
    starts: dict[int, np.ndarray] = {}  # each pack's record starts, read when a cut falls in it
    cuts = [(0, 0)]  # (position in ``packs``, offset): where each part starts
    for k in range(1, parts):
        wanted, number = k * total // parts, 0
        while number < len(packs) - 1 and wanted >= packs[number][1]:
            wanted -= packs[number][1]
            number += 1
        if packs and number not in starts:
            starts[number] = _record_starts(blobs, *packs[number])
        found = starts[number][np.searchsorted(starts[number], wanted) :] if packs else np.empty(0)
        cut = (number, int(found[0])) if len(found) else (number + 1, 0)
        cuts.append(max(cuts[-1], cut))
    cuts.append((len(packs), 0))
    return [_spans(packs, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]


def _record_starts(blobs: BlobStore, name: str, size: int) -> np.ndarray:
    """The offsets in the pack where its index says records start, sorted."""
    index = blobs.packs_dir / (name[: -len(packstore.PACK_SUFFIX)] + packstore.IDX_SUFFIX)
    try:
        offsets = np.frombuffer(packstore.index_bytes(index)[0], ENTRY)["offset"].astype(np.int64)
    except (OSError, ValueError):
        return np.empty(0, np.int64)
    return np.unique(offsets[(offsets >= len(packstore.PACK_MAGIC)) & (offsets < size)])


def _spans(packs: list[tuple[str, int]], first: tuple[int, int], end: tuple[int, int]) -> list[Span]:
    """The spans from ``first`` (a pack's position and an offset in it) to before ``end``."""
    spans: list[Span] = []
    for number in range(first[0], min(end[0] + 1, len(packs))):
        start = first[1] if number == first[0] else 0
        stop = end[1] if number == end[0] else None
        if stop != 0:
            spans.append((packs[number][0], start, stop))
    return spans
