"""A process's view of the packs' indexes: blob address -> where its record lies, in flat arrays.

A dict of ``Entry`` tuples keyed by hex strings took about 300 bytes a blob: a store of 8,000
synthetic runs holds a million blobs, and every command that reads blobs (scoring, the viewer,
verify) held 300 MB of index, growing with the store. Here each entry is kept as the index file
holds it (``packstore.ENTRY``: the 32-byte digest, offset, length and codec, 45 bytes) beside the
number of its pack, and found through an open-addressing table of entry numbers (4 bytes a slot,
at most half full): about 70 bytes a blob. The slot of an address comes from Python's own hash of
its digest (keyed per process), so addresses made to collide cannot slow the lookups.

As with the dict it replaces, a later entry for an address wins (packs are read in the order of
their names, each index front to back).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

from schemas import packstore

EMPTY = -1
_SIZE = packstore.ENTRY.size
_TAIL = packstore.ENTRY.size - 32
_FIELDS = packstore.ENTRY


class PackIndex:
    """Blob hex address -> ``packstore.Entry``, for the packs read so far."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._entries = bytearray()  # ENTRY after ENTRY, in the order read
        self._packs = array("I")  # the pack number of each entry
        self._names: list[str] = []
        self._numbers: dict[str, int] = {}
        self._slots = array("i", [EMPTY]) * 16  # entry numbers; a power of two in size
        self._count = 0  # distinct addresses

    def __len__(self) -> int:
        return self._count

    def __contains__(self, hexd: str) -> bool:
        return self._slots[self._slot(_digest(hexd))] != EMPTY

    def get(self, hexd: str) -> packstore.Entry | None:
        at = self._slots[self._slot(_digest(hexd))]
        if at == EMPTY:
            return None
        _, offset, length, codec = _FIELDS.unpack_from(self._entries, at * _SIZE)
        return packstore.Entry(self._names[self._packs[at]], offset, length, codec)

    def __iter__(self) -> Iterator[str]:
        """The hex addresses (in no particular order)."""
        for at in self._slots:
            if at != EMPTY:
                yield self._entries[at * _SIZE : at * _SIZE + 32].hex()

    def add(self, pack: str, entries: bytes | bytearray) -> None:
        """The whole entries of ``pack``'s index (``packstore.index_bytes``), in file order."""
        number = self._number(pack)
        first = len(self._packs)
        n = len(entries) // _SIZE
        self._entries += entries[: n * _SIZE]
        self._packs.extend(array("I", [number]) * n)
        self._reserve(self._count + n)
        for at in range(first, first + n):
            self._place(at)

    def put(self, hexd: str, entry: packstore.Entry) -> None:
        """One entry, as a writer appends it."""
        at = len(self._packs)
        self._entries += _FIELDS.pack(bytes.fromhex(hexd), entry.offset, entry.length, entry.codec)
        self._packs.append(self._number(entry.pack))
        if 2 * (self._count + 1) > len(self._slots):
            self._reserve(self._count + 1)
        self._place(at)

    def _number(self, pack: str) -> int:
        number = self._numbers.get(pack)
        if number is None:
            number = self._numbers[pack] = len(self._names)
            self._names.append(pack)
        return number

    def drop_packs(self, gone: set[str]) -> None:
        """Forget the entries of these packs (repacked by gc: their blobs were indexed anew first)."""
        numbers = {self._numbers[p] for p in gone if p in self._numbers}
        if not numbers:
            return
        kept = [at for at in self._slots if at != EMPTY and self._packs[at] not in numbers]
        entries, packs, names = self._entries, self._packs, self._names
        self.clear()
        for at in sorted(kept):  # (file order kept: the later of two entries still wins)
            self.add(names[packs[at]], entries[at * _SIZE : (at + 1) * _SIZE])

    def _slot(self, digest: bytes) -> int:
        """The slot that holds ``digest``'s entry, else the empty slot where it would go."""
        slots, entries = self._slots, self._entries
        mask = len(slots) - 1
        i = hash(digest) & mask
        while True:
            at = slots[i]
            if at == EMPTY or entries[at * _SIZE : at * _SIZE + 32] == digest:
                return i
            i = (i + 1) & mask

    def _place(self, at: int) -> None:
        i = self._slot(bytes(self._entries[at * _SIZE : at * _SIZE + 32]))
        if self._slots[i] == EMPTY:
            self._count += 1
        self._slots[i] = at  # a later entry for the same address replaces the earlier

    def _reserve(self, count: int) -> None:
        """Room for ``count`` addresses with the table at most half full."""
        size = len(self._slots)
        if 2 * count <= size:
            return
        while 2 * count > size:
            size *= 2
        live = [at for at in self._slots if at != EMPTY]
        self._slots = array("i", [EMPTY]) * size
        self._count = 0
        for at in live:
            self._place(at)


def _digest(hexd: str) -> bytes:
    try:
        digest = bytes.fromhex(hexd)
    except ValueError:
        return b""  # not an address: found nowhere
    return digest if len(digest) == 32 else b""
