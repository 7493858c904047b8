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
        table = np.concatenate(entries) if entries else np.empty(0, ENTRY)
        pack = np.concatenate(packs) if packs else np.empty(0, np.uint32)
        del entries, packs
        order = np.argsort(table["digest"], kind="stable")  # an address's entries stay in file order
        table, pack = table[order], pack[order]
        del order
        last = np.ones(len(table), bool)  # the last entry for each address is the one reads use
        last[:-1] = table["digest"][1:] != table["digest"][:-1]
        self.table, self.pack = table[last], pack[last]
        self.ok = np.zeros(len(self.table), bool)
        self._numbers = {name[: -len(packstore.IDX_SUFFIX)]: n for n, name in enumerate(names)}
        self._walk: Iterator[_Walked] = iter(())
        self._next: _Walked | None = None

    def start(self, pack: str) -> None:
        number = self._numbers.get(pack)
        mine = np.flatnonzero(self.pack == number) if number is not None else np.empty(0, np.intp)
        mine = mine[np.argsort(self.table["offset"][mine], kind="stable")]
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
        wanted = np.frombuffer(b"".join(digests), "V32")
        known = self.table["digest"]
        at = np.minimum(np.searchsorted(known, wanted), len(known) - 1)
        good = (known[at] == wanted) & self.ok[at]
        return [a for a, g in zip(addresses, good.tolist(), strict=True) if not g]


def _index_names(packs: os.PathLike[str]) -> list[str]:
    """The pack indexes, in the order the blob store reads them (a later entry wins)."""
    try:
        return sorted(n for n in os.listdir(packs) if n.endswith(packstore.IDX_SUFFIX))
    except FileNotFoundError:
        return []
