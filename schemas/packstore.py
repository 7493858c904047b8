"""The blob store's packs: many blobs per file, indexed by address. A CONTRACT.

A store holds its blobs in ``blobs/packs/``: append-only pack files, each written by one process,
and beside each an index that maps a blob's address to where its record lies. A blob read is one
``pread`` of the record; ``amb verify`` streams each pack front to back.

Formats::

    <id>.pack := PACK_MAGIC record*
    record    := HEX SP CODEC SP LENGTH LF STORED
    HEX       := the blob's address without ``sha256:`` (64 lowercase hex characters)
    CODEC     := one byte of ``schemas.blobcodec`` (z, s, r, c)
    LENGTH    := len(STORED) in decimal

    <id>.idx  := IDX_MAGIC entry*
    entry     := DIGEST(32 bytes) OFFSET(u64 BE) LENGTH(u32 BE) CODEC(1 byte)   (45 bytes)

An entry's OFFSET and LENGTH cover the whole record, header included, so a read checks that the
record it lands on names the blob that was asked for: a hostile or damaged index (an offset out of
range, a length that lies, an entry pointing at another record) fails with an error naming the
blob and the pack, and nothing is read outside the pack (every range is checked against the
pack's size before the read). The content is always re-hashed against the address.

Write order: the record, then its index entry (with ``sync``, each fsync'd), so an entry never
points at bytes that were not written; a torn tail or a torn index entry is ignored. Only a pack's
writer appends to it, holding an exclusive ``flock`` while it is open (``amb gc --blobs`` rewrites
only packs nobody holds).
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from schemas.durable import fsync_dir
from schemas.errors import BlobError

PACK_MAGIC = b"AMBPACK 1\n"
IDX_MAGIC = b"AMBPIDX 1\n"
PACK_SUFFIX = ".pack"
IDX_SUFFIX = ".idx"
ENTRY = struct.Struct(">32sQIB")
PACK_LIMIT = 1 << 30
"""A writer starts a new pack past this size (packs stay easy to copy and to repack)."""
HEADER_MAX = 64 + 1 + 1 + 1 + 12 + 1
_HEADER = re.compile(rb"([0-9a-f]{64}) ([a-z]) (0|[1-9][0-9]{0,11})\n")


class Entry(NamedTuple):
    pack: str
    """The pack's id (its file name without the suffix)."""
    offset: int
    length: int
    codec: int


class Record(NamedTuple):
    hexd: str
    codec: int
    offset: int
    """Where the record (its header) starts in the pack."""
    length: int
    """The whole record's length, header included."""
    stored: bytes


def record_bytes(hexd: str, codec: int, stored: bytes | memoryview) -> bytes:
    return b"%s %c %d\n" % (hexd.encode(), codec, len(stored)) + bytes(stored)


def new_pack_id() -> str:
    return f"{time.time_ns():016x}-{os.getpid()}-{os.urandom(3).hex()}"


def parse_record(data: bytes | memoryview, hexd: str, where: str) -> tuple[int, memoryview]:
    """The codec and stored bytes of one whole record that must be the blob ``hexd``."""
    view = memoryview(data)
    m = _HEADER.match(bytes(view[:HEADER_MAX]))
    if m is None:
        raise BlobError(f"blob sha256:{hexd} is corrupted ({where}: the index points at no record)")
    if m.group(1).decode() != hexd:
        raise BlobError(
            f"blob sha256:{hexd} is corrupted ({where}: the index points at another blob's record)"
        )
    if m.end() + int(m.group(3)) != len(view):
        raise BlobError(f"blob sha256:{hexd} is corrupted ({where}: the index gives a wrong length)")
    return m.group(2)[0], view[m.end() :]


def scan(path: Path, block: int = 8 << 20, start: int = 0, stop: int | None = None) -> Iterator[Record]:
    """Every complete record of a pack, in order, from one sequential pass over it; or those that
    start from byte ``start`` (which must be where a record starts) and before byte ``stop``.

    Stops at a torn tail (a writer killed mid-record); a malformed header is an error."""
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), start, 0, os.POSIX_FADV_SEQUENTIAL)
        if start > len(PACK_MAGIC):
            f.seek(start)
            buf, base, pos = f.read(block), start, 0  # buf holds the pack from byte ``base``
        else:
            buf = f.read(max(block, len(PACK_MAGIC)))
            if len(buf) < len(PACK_MAGIC):
                return
            if buf[: len(PACK_MAGIC)] != PACK_MAGIC:
                raise BlobError(f"{path.name}: not a blob pack (bad magic)")
            base, pos = 0, len(PACK_MAGIC)
        eof = False
        while stop is None or base + pos < stop:
            m = _HEADER.match(buf, pos, pos + HEADER_MAX)
            need = m.end() + int(m.group(3)) if m else pos + HEADER_MAX
            if need > len(buf) and not eof:
                more = f.read(max(block, need - len(buf)))
                eof = not more
                buf, base, pos = buf[pos:] + more, base + pos, 0
                continue
            if pos >= len(buf):
                return
            if m is None:
                if buf.find(b"\n", pos, pos + HEADER_MAX) == -1 and len(buf) - pos < HEADER_MAX:
                    return  # a header cut short
                raise BlobError(f"{path.name}: byte {base + pos}: not a blob record header")
            if need > len(buf):
                return  # a record cut short
            yield Record(m.group(1).decode(), m.group(2)[0], base + pos, need - pos, buf[m.end() : need])
            pos = need


def read_index(path: Path, start: int = 0) -> tuple[list[tuple[str, int, int, int]], int]:
    """The whole entries of an index from byte ``start`` on, and the offset after the last one."""
    data, start = index_bytes(path, start)
    out = [(d.hex(), off, n, codec) for d, off, n, codec in ENTRY.iter_unpack(data)]
    return out, start + len(data)


def index_bytes(path: Path, start: int = 0) -> tuple[bytes, int]:
    """The whole entries of an index from byte ``start`` on (``ENTRY`` after ``ENTRY``), and where
    they start in the file."""
    first = start or len(IDX_MAGIC)
    return b"".join(index_blocks(path, start)), first


def index_blocks(path: Path, start: int = 0, block: int = ENTRY.size << 15) -> Iterator[bytes]:
    """The whole entries of an index from byte ``start`` on (after the magic if 0), a block of
    whole entries at a time: a reader that keeps them packed never holds the file twice."""
    with open(path, "rb") as f:
        if start == 0:
            head = f.read(len(IDX_MAGIC))
            if head != IDX_MAGIC:
                if IDX_MAGIC.startswith(head):
                    return  # its writer has just made it (or died doing so): no entries yet
                raise BlobError(f"{path.name}: not a blob pack index (bad magic)")
        else:
            f.seek(start)
        while data := f.read(block):
            whole = len(data) - len(data) % ENTRY.size
            yield data[:whole]
            if whole < len(data):
                return  # a torn tail (a read comes short only at the end of the file)


class PackWriter:
    """Appends records to one new pack and its index. One per process and store (``BlobStore``)."""

    def __init__(self, packs: Path):
        packs.mkdir(parents=True, exist_ok=True)
        self.id = new_pack_id()
        self.pack_path = packs / (self.id + PACK_SUFFIX)
        self.idx_path = packs / (self.id + IDX_SUFFIX)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        self._pack = os.open(self.pack_path, flags, 0o444)
        fcntl.flock(self._pack, fcntl.LOCK_EX)  # "open": gc --blobs leaves it alone
        os.write(self._pack, PACK_MAGIC)
        self._idx = os.open(self.idx_path, flags, 0o444)
        os.write(self._idx, IDX_MAGIC)
        self.size = len(PACK_MAGIC)
        self._dirty = False

    def append(self, hexd: str, codec: int, stored: bytes | memoryview, *, sync: bool) -> Entry:
        record = record_bytes(hexd, codec, stored)
        offset = self.size
        _write_all(self._pack, record, self.pack_path)
        self.size += len(record)
        if sync:
            os.fsync(self._pack)
        _write_all(self._idx, ENTRY.pack(bytes.fromhex(hexd), offset, len(record), codec), self.idx_path)
        if sync:
            os.fsync(self._idx)
        else:
            self._dirty = True
        return Entry(self.id, offset, len(record), codec)

    def flush(self) -> None:
        """Make every record appended so far durable: the pack first, then its index."""
        if self._dirty and self._pack >= 0:
            os.fsync(self._pack)
            os.fsync(self._idx)
            self._dirty = False

    def close(self) -> None:
        if self._pack < 0:
            return
        self.flush()
        os.close(self._idx)
        os.close(self._pack)  # releases the flock: the pack is sealed
        self._pack = self._idx = -1
        fsync_dir(self.pack_path.parent)


def _write_all(fd: int, data: bytes, path: Path) -> None:
    try:
        written = os.write(fd, data)
    except OSError as e:
        raise BlobError(f"cannot write to {path.name}: {e}") from e
    if written != len(data):  # a short write to a regular file: the disk is full
        raise BlobError(f"cannot write to {path.name}: short write (disk full?)")


def is_open(pack: Path) -> bool:
    """True while a writer holds the pack (its records may still grow)."""
    try:
        fd = os.open(pack, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
