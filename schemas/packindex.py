"""A process's view of the packs' indexes: blob address -> where its record lies, in 8 bytes a blob.

The process keeps one sorted 64-bit number an entry: the first ``KEY_BITS`` bits of the address
above the entry's arrival number (``NUMBER_BITS``), which names the pack and the entry's place in
its index file. A lookup bisects to the entries whose addresses start the same and reads each back
from its index file (one ``pread`` of 45 bytes) to compare the whole address (docs/blob-packs.md).

As with a dict of the entries, a later entry for an address wins (packs are read in the order of
their names, each index front to back). Entries this process appends (``put``) are kept whole in a
small dict until there are enough of them to sort in. Addresses made to share their first bits
cost their maker about 2**KEY_BITS hashes each, and a lookup of them one extra read each.
"""

from __future__ import annotations

import os
import threading
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas import packstore
from schemas.errors import BlobError

if TYPE_CHECKING:
    import numpy as np

KEY_BITS = 34
NUMBER_BITS = 64 - KEY_BITS
NUMBER_MASK = (1 << NUMBER_BITS) - 1
"""Up to 2**30 entries read by one process: 48 GB of index files."""
FAN_BITS = 16
"""The sorted keys are found through a table of where each value of their first 16 bits starts
(256 KB): a bisection then spans a few entries, not the whole index."""
FDS_KEPT = 64
"""Files ``cached_fd`` keeps open (the least recently opened closed first)."""
_SIZE = packstore.ENTRY.size
_HEAD = len(packstore.IDX_MAGIC)


class PackIndex:
    """Blob hex address -> ``packstore.Entry``, for the index entries of the packs in ``packs`` read
    so far (``add``) or appended by this process (``put``)."""

    def __init__(self, packs: Path) -> None:
        self.packs = Path(packs)
        self._lock = threading.RLock()
        self._fds: dict[int, int] = {}
        self.clear()

    def clear(self) -> None:
        with self._lock:
            close_all(self._fds)
            self._keys = array("Q")  # key << NUMBER_BITS | arrival number; sorted unless _dirty
            self._dirty = False
            self._fan = array("I", bytes(4 * ((1 << FAN_BITS) + 1)))
            self._recent: dict[bytes, tuple[int, packstore.Entry]] = {}  # put, not yet sorted in
            self._names: list[str] = []
            self._numbers: dict[str, int] = {}
            self._seen: list[int] = []  # entries of each pack arrived so far
            self._starts: list[int] = []  # the arrival number at which each segment starts...
            self._segments: list[tuple[int, int]] = []  # ...and its (pack number, place in the file)
            self._arrived = 0

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, hexd: str) -> bool:
        return self.get(hexd) is not None

    def get(self, hexd: str) -> packstore.Entry | None:
        digest = _digest(hexd)
        if not digest:
            return None
        with self._lock:
            found = self._find(digest)
            return None if found is None else found[1]

    def __iter__(self) -> Iterator[str]:
        """The hex addresses, each once (in the order their last entries arrived)."""
        with self._lock:
            segments = len(self._starts)
        for s in range(segments):
            with self._lock:
                winners = [
                    digest.hex()
                    for number, digest in self._segment_entries(s)
                    if (found := self._find(digest)) is not None and found[0] == number
                ]
            yield from winners

    def add(self, pack: str, entries: bytes | bytearray) -> None:
        """The whole entries of ``pack``'s index (``packstore.index_bytes``), in file order."""
        n = len(entries) // _SIZE
        if not n:
            return
        with self._lock:
            p = self._number(pack)
            first = self._arrive(p, n)
            import numpy as np  # here: a command that reads no blob does not pay for numpy's import

            rows = np.frombuffer(entries, dtype=np.uint8, count=n * _SIZE).reshape(n, _SIZE)
            keys = rows[:, :8].copy().view(">u8").ravel() >> np.uint64(NUMBER_BITS)
            keys <<= np.uint64(NUMBER_BITS)
            keys |= np.arange(first, first + n, dtype=np.uint64)
            self._keys.frombytes(keys.astype(np.uint64).tobytes())
            self._dirty = True

    def put(self, hexd: str, entry: packstore.Entry) -> None:
        """One entry, as a writer appends it (the last of its pack's index file)."""
        with self._lock:
            number = self._arrive(self._number(entry.pack), 1)
            self._recent[bytes.fromhex(hexd)] = (number, entry)
            if len(self._recent) > max(1 << 14, len(self._keys) >> 3):
                for digest, (n, _) in self._recent.items():
                    self._keys.append(_key(digest) << NUMBER_BITS | n)
                self._recent.clear()
                self._dirty = True

    def drop_packs(self, gone: set[str]) -> None:
        """Forget the entries of these packs (repacked by gc: their blobs were indexed anew first)."""
        with self._lock:
            numbers = {self._numbers[p] for p in gone if p in self._numbers}
            if not numbers:
                return
            self._settle()
            import numpy as np

            values = np.frombuffer(self._keys, dtype=np.uint64)
            packs = self._packs_of(values & np.uint64(NUMBER_MASK))
            kept = values[~np.isin(packs, list(numbers))].copy()
            del values
            self._keys = array("Q", kept.tobytes())
            self._dirty = True  # (sorted, but its table of starts made anew)
            self._recent = {d: v for d, v in self._recent.items() if self._numbers[v[1].pack] not in numbers}
            for p in numbers:
                fd = self._fds.pop(p, None)
                if fd is not None:
                    os.close(fd)

    def close(self) -> None:
        with self._lock:
            close_all(self._fds)

    def _find(self, digest: bytes) -> tuple[int, packstore.Entry] | None:
        """The arrival number and entry of the last entry for ``digest``, or None."""
        self._settle()
        recent = self._recent.get(digest)
        key, keys = _key(digest), self._keys
        fan = key >> (KEY_BITS - FAN_BITS)
        first = self._fan[fan]
        i = bisect_right(keys, key << NUMBER_BITS | NUMBER_MASK, first, self._fan[fan + 1])
        while i > first and keys[i - 1] >> NUMBER_BITS == key:
            i -= 1
            number = keys[i] & NUMBER_MASK
            if recent is not None and recent[0] > number:
                break
            entry = self._read_back(number, digest)
            if entry is not None:
                return number, entry
        return recent

    def _settle(self) -> None:
        """The entries added since the last lookup sorted in (in place: no second copy)."""
        if self._dirty:
            import numpy as np

            view = np.frombuffer(self._keys, dtype=np.uint64)
            view.sort()
            starts = np.arange((1 << FAN_BITS) + 1, dtype=np.uint64) << np.uint64(64 - FAN_BITS)
            starts[-1] = ~np.uint64(0)
            fan = np.searchsorted(view, starts, side="left").astype(np.uint32)
            fan[-1] = len(view)
            del view  # (the array cannot grow while a view of it is held)
            self._fan = array("I", fan.tobytes())
            self._dirty = False

    def _read_back(self, number: int, digest: bytes) -> packstore.Entry | None:
        """The entry arrived as ``number``, read from its index file, if it is ``digest``'s."""
        s = bisect_right(self._starts, number) - 1
        p, place = self._segments[s]
        raw = self._pread(p, _HEAD + (place + number - self._starts[s]) * _SIZE)
        if len(raw) != _SIZE or raw[:32] != digest:
            return None  # (an index file rewritten or gone since: the caller reads the index again)
        _, offset, length, codec = packstore.ENTRY.unpack(raw)
        return packstore.Entry(self._names[p], offset, length, codec)

    def _pread(self, p: int, at: int, size: int = _SIZE) -> bytes:
        try:
            fd = cached_fd(self._fds, p, self.packs / (self._names[p] + packstore.IDX_SUFFIX))
        except FileNotFoundError:
            return b""
        return os.pread(fd, size, at)

    def _segment_entries(self, s: int) -> Iterator[tuple[int, bytes]]:
        """(arrival number, address digest) of segment ``s``'s entries, read back from its file."""
        start = self._starts[s]
        end = self._starts[s + 1] if s + 1 < len(self._starts) else self._arrived
        p, place = self._segments[s]
        for at in range(start, end, 1 << 15):
            n = min(1 << 15, end - at)
            raw = self._pread(p, _HEAD + (place + at - start) * _SIZE, n * _SIZE)
            for i in range(len(raw) // _SIZE):
                yield at + i, raw[i * _SIZE : i * _SIZE + 32]

    def _packs_of(self, numbers: np.ndarray) -> np.ndarray:
        import numpy as np

        at = np.searchsorted(np.array(self._starts, dtype=np.uint64), numbers, side="right") - 1
        return np.array([p for p, _ in self._segments], dtype=np.int64)[at]

    def _number(self, pack: str) -> int:
        number = self._numbers.get(pack)
        if number is None:
            number = self._numbers[pack] = len(self._names)
            self._names.append(pack)
            self._seen.append(0)
        return number

    def _arrive(self, p: int, n: int) -> int:
        """Arrival numbers for ``n`` more entries of pack ``p``, next in its index file: the first."""
        first, place = self._arrived, self._seen[p]
        if first + n > NUMBER_MASK:
            raise BlobError(f"the blob store's indexes hold more than {NUMBER_MASK:,} entries")
        last = self._segments[-1] if self._segments else None
        if last is None or last[0] != p or place != last[1] + first - self._starts[-1]:
            self._starts.append(first)
            self._segments.append((p, place))
        self._arrived += n
        self._seen[p] += n
        return first


def cached_fd(fds: dict[Any, int], key: Any, path: Path) -> int:
    """``path`` opened for reading, kept in ``fds`` under ``key``: a process that reads many packs
    keeps few descriptors."""
    fd = fds.get(key)
    if fd is None:
        if len(fds) >= FDS_KEPT:
            for old in list(fds)[: FDS_KEPT // 4]:
                os.close(fds.pop(old))
        fd = fds[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    return fd


def close_all(fds: dict[Any, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()


def _key(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big") >> NUMBER_BITS


def _digest(hexd: str) -> bytes:
    try:
        digest = bytes.fromhex(hexd)
    except ValueError:
        return b""  # not an address: found nowhere
    return digest if len(digest) == 32 else b""
