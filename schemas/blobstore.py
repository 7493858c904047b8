"""The content-addressed blob store: one directory, shared by every run. A CONTRACT
(docs/blob-packs.md).

A blob's address is ``sha256:`` + the sha256 of its whole, uncompressed content, however it is
stored: in packs (``schemas.packstore``), or as loose files ``<root>/<hex[0:2]>/<hex[2:]>`` of a
store written before packs (moved into packs by ``amb blobs migrate``). A stored blob is its content
(``schemas.blobcodec``), a chunk list (above ``CHUNK_ABOVE``) or a delta against a ``base``; reads
re-hash what they return, and refuse a delta chain deeper than ``DELTA_READ_DEPTH`` (a hostile
record naming itself is an error, not a hang).

A process that stores blobs holds a shared ``flock`` on ``<root>/.writers.lock`` from its first
write until it closes the store, drops its last ``BlobStore`` of it or exits; ``amb gc --blobs``
takes it exclusively, so it never drops a blob a writer may have relied on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from schemas import blobcodec, durable, packstore
from schemas.blob import DIGEST_RE, HASH_PREFIX, BlobRef
from schemas.blobchunks import CHUNK_ABOVE, chunk_bounds
from schemas.errors import BlobError
from schemas.packindex import PackIndex, cached_fd, close_all

COMPRESSION_LEVEL = 3
"""zlib level 3 (loose files and the recorder's run packs): most of level 9's ratio on JSON and
text, at a fraction of the time."""

CHUNK_MAGIC = b"AMBCHUNKS 1\n"
"""The first line of a chunk list (``schemas.blobchunks`` says where the chunks are cut)."""
DELTA_DEPTH = 16
"""A delta's base is at most this many deltas deep; past it the body is stored whole (or chunked)."""
DELTA_READ_DEPTH = 64
DELTA_MAX = 4 * 1024 * 1024
"""Bodies above this are chunked, never stored as deltas (a base is held in memory as a dictionary)."""
BASES_KEPT = 32
BASES_BYTES = 16 * 1024 * 1024
"""How many recently stored contents (and bytes of them) a ``BlobStore`` keeps as delta bases."""
DECODE_LIMIT = 64 * 1024 * 1024
"""No stored record may expand to more than this (a chunk is at most MAX_CHUNK; old stores kept
some whole blobs above CHUNK_ABOVE): a hostile record cannot make a read allocate more."""
WRITERS_LOCK = ".writers.lock"
PACKS = "packs"


class Usage(NamedTuple):
    """What the blob store occupies: each ``*_disk`` is what ``du`` counts (allocated blocks)."""

    packs: int
    pack_bytes: int
    pack_disk: int
    index_bytes: int
    index_disk: int
    loose_files: int
    loose_bytes: int
    loose_disk: int


class _Shared:
    """One store root's state in one process (the index read so far, open pack descriptors, the
    pack writer), shared by its every ``BlobStore`` so that the process writes one pack."""

    def __init__(self, root: Path):
        self.root = root
        self.packs = root / PACKS
        self.lock = threading.RLock()
        self.index = PackIndex(self.packs)
        self.read_upto: dict[str, int] = {}
        self.fds: dict[str, int] = {}
        self.writer: packstore.PackWriter | None = None
        self.writers_lock = -1
        self.loaded = False
        self.users = 0
        """``BlobStore`` objects of this root the process holds, closed or not (``_let_go``)."""

    def refresh(self) -> None:
        """Read the index entries added since the last refresh (by any process)."""
        with self.lock:
            self.loaded = True
            try:
                names = os.listdir(self.packs)
            except FileNotFoundError:
                return
            present = set()
            for name in sorted(names):
                if not name.endswith(packstore.IDX_SUFFIX):
                    continue
                pack = name[: -len(packstore.IDX_SUFFIX)]
                present.add(pack)
                path = self.packs / name
                start = self.read_upto.get(pack, 0)
                end = start or len(packstore.IDX_MAGIC)
                try:
                    # An index shorter than its magic is one another process has just created: it
                    # is read from the start (and its magic checked) once it holds more.
                    if path.stat().st_size <= (start or len(packstore.IDX_MAGIC) - 1):
                        continue
                    for entries in packstore.index_blocks(path, start):
                        self.index.add(pack, entries)
                        end += len(entries)
                except FileNotFoundError:
                    continue
                self.read_upto[pack] = end
            gone = set(self.read_upto) - present
            if gone:  # repacked by gc: forget them (their blobs were indexed in a new pack first)
                for pack in gone:
                    self.read_upto.pop(pack)
                self.index.drop_packs(gone)

    def lookup(self, hexd: str) -> packstore.Entry | None:
        if not self.loaded:
            self.refresh()
        return self.index.get(hexd)

    def fd(self, pack: str) -> int:
        with self.lock:
            return cached_fd(self.fds, pack, self.packs / (pack + packstore.PACK_SUFFIX))

    def hold(self) -> None:
        """Take the writers' lock (shared; waits while gc --blobs runs), then re-read the index:
        from here on, a blob this process finds stored stays stored until it lets go."""
        with self.lock:
            if self.writers_lock >= 0:
                return
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / WRITERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
            self.writers_lock = fd
            self.refresh()  # gc may have repacked since this process last looked

    def release(self) -> None:
        with self.lock:
            if self.writer is not None:
                self.writer.close()
                self.writer = None
            if self.writers_lock >= 0:
                os.close(self.writers_lock)
                self.writers_lock = -1
            close_all(self.fds)
            self.index.close()


_SHARED: dict[tuple[int, str], _Shared] = {}
_SHARED_LOCK = threading.RLock()  # (re-entered when a collection drops a store's last user meanwhile)


def _let_go(key: tuple[int, str], state: _Shared) -> None:
    """One user of ``state`` is done: the last one seals the pack, closes every descriptor of the
    store and forgets the index read (a process that opens many stores keeps none it is done with)."""
    if os.getpid() != key[0]:
        return  # a forked child's copy: the descriptors are the parent's
    with _SHARED_LOCK:
        state.users -= 1
        if state.users > 0:
            return
        if _SHARED.get(key) is state:
            del _SHARED[key]
    state.release()


class RecentContents:
    """The last contents kept by address, each with how many deltas deep it is: at most
    ``BASES_KEPT`` of them and ``BASES_BYTES`` in all, the oldest out first; none above ``DELTA_MAX``."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, tuple[bytes, int]] = OrderedDict()
        self._bytes = 0

    def get(self, hexd: str) -> tuple[bytes, int] | None:
        return self._kept.get(hexd)

    def keep(self, hexd: str, data: bytes, depth: int = 0) -> None:
        if len(data) > DELTA_MAX or hexd in self._kept:
            return
        self._kept[hexd] = (data, depth)
        self._bytes += len(data)
        while len(self._kept) > BASES_KEPT or self._bytes > BASES_BYTES:
            self._bytes -= len(self._kept.popitem(last=False)[1][0])

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0


class DeltaBases(RecentContents):
    """The contents a writer stored lately: the bases a later put with ``base=`` can use without
    reading them back. One per writer (a run's), not shared."""

    def delta(self, data: bytes, base: BlobRef | None) -> tuple[bytes, int] | None:
        """The stored bytes of ``data`` as a delta against ``base`` and its depth, or None when
        the base is not at hand, its chain is long enough already, or a delta would not pay."""
        if base is None or len(data) > DELTA_MAX:
            return None
        base_hex = base.blob[len(HASH_PREFIX) :]
        kept = self.get(base_hex)
        if kept is None or kept[1] >= DELTA_DEPTH:
            return None
        stored = blobcodec.encode_delta(data, base_hex, kept[0])
        return None if stored is None else (stored, kept[1] + 1)


class BlobStore:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        key = (os.getpid(), os.path.abspath(root))  # a forked child never writes its parent's pack
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = _Shared(Path(key[1]))
            self._state = _SHARED[key]
            self._state.users += 1
        # The last one dropped closes the store's descriptors (at exit, the system does).
        weakref.finalize(self, _let_go, key, self._state).atexit = False
        self._bases = DeltaBases()
        self._read = RecentContents()
        """Contents this object read lately (each checked against its address): reading a run's
        requests in order then costs one decompression each, not their chain's."""
        self._read_lock = threading.Lock()

    @property
    def packs_dir(self) -> Path:
        return self._state.packs

    def path_of(self, blob: str) -> Path:
        """Where a *loose* blob file of this address lives (stores written before packs)."""
        if not DIGEST_RE.match(blob):
            raise BlobError(f"not a blob address: {blob!r}")
        hexd = blob[len(HASH_PREFIX) :]
        return self.root / hexd[:2] / hexd[2:]

    def has(self, hexd: str) -> bool:
        """True if the blob is stored (packed, as far as this process has read the index, or loose)."""
        return self.packed(hexd) or (self.root / hexd[:2] / hexd[2:]).exists()

    def packed(self, hexd: str) -> bool:
        """True if a pack holds the blob (as far as this process has read the index)."""
        return self._state.lookup(hexd) is not None

    def entry(self, hexd: str) -> packstore.Entry | None:
        return self._state.lookup(hexd)

    def put(
        self,
        data: bytes,
        media_type: str = "application/octet-stream",
        *,
        sync: bool = True,
        base: BlobRef | None = None,
    ) -> BlobRef:
        """Store ``data`` once; return its reference. ``sync`` makes it durable before returning.

        ``base``: a blob this content probably extends (the previous request of the same run); if
        this object stored it lately, ``data`` is stored as a delta against it when that is smaller."""
        hexd = hashlib.sha256(data).hexdigest()
        ref = BlobRef(blob=HASH_PREFIX + hexd, size=len(data), media_type=media_type)
        state = self._state
        with state.lock:
            state.hold()  # the writers' lock comes before trusting the index (the pack, at a write)
            if self.has(hexd):
                return ref
            delta = self._bases.delta(data, base)
            self._bases.keep(hexd, data, delta[1] if delta else 0)
            if delta is not None:
                self._append(hexd, blobcodec.DELTA, delta[0], sync=sync)
                return ref
            bounds = chunk_bounds(data) if len(data) > CHUNK_ABOVE else []
            if len(bounds) > 1:  # one chunk would be the blob itself: stored whole
                view, start, chunks = memoryview(data), 0, []
                for end in bounds:
                    chunk = view[start:end]
                    address = hashlib.sha256(chunk).hexdigest()
                    if not self.has(address):
                        self._append(address, *blobcodec.encode(chunk), sync=False)
                    chunks.append(HASH_PREFIX + address + "\n")
                    start = end
                self._append(hexd, blobcodec.CHUNKS, CHUNK_MAGIC + "".join(chunks).encode(), sync=sync)
            else:
                self._append(hexd, *blobcodec.encode(data), sync=sync)
        return ref

    def addresses(self) -> list[str]:
        """The hex address of every packed blob, as the index says now (loose files not included)."""
        self._state.refresh()
        return list(self._state.index)

    def stored_record(self, hexd: str) -> tuple[int, memoryview]:
        """The codec and stored bytes of a packed blob (for copying it to another store as it is)."""
        entry = self._state.lookup(hexd)
        if entry is None:
            raise BlobError(f"blob {HASH_PREFIX}{hexd} is not in a pack")
        return self.read_record(hexd, entry)

    def put_stored(
        self, hexd: str, stored: bytes | memoryview, *, sync: bool = True, codec: int | None = None
    ) -> bool:
        """Store a blob already encoded under its address: by default as a loose file is (zlib, or
        a chunk list), a record of the recorder's run pack. True if it was new."""
        if not DIGEST_RE.match(HASH_PREFIX + hexd):
            raise BlobError(f"not a blob address: {HASH_PREFIX}{hexd!r}")
        if codec is None:
            codec = loose_codec(stored)
        with self._state.lock:
            self._state.hold()
            if hexd in self._state.index or self._state.lookup(hexd):
                return False
            self._append(hexd, codec, stored, sync=sync)
        return True

    def _append(self, hexd: str, codec: int, stored: bytes | memoryview, *, sync: bool) -> None:
        state = self._state
        if state.writer is not None and state.writer.size >= packstore.PACK_LIMIT:
            state.writer.close()
            state.writer = None
        if state.writer is None:  # opened (and the writers' lock taken) on first use
            state.hold()
            state.writer = packstore.PackWriter(state.packs)
        entry = state.writer.append(hexd, codec, stored, sync=sync)
        state.index.put(hexd, entry)
        state.read_upto[entry.pack] = (
            state.read_upto.get(entry.pack, len(packstore.IDX_MAGIC)) + packstore.ENTRY.size
        )

    def flush(self) -> None:
        """Make every blob this process stored durable (after ``put(..., sync=False)``)."""
        with self._state.lock:
            if self._state.writer is not None:
                self._state.writer.flush()

    def close(self) -> None:
        """Seal this process's pack, release the writers' lock and close the store's descriptors.
        This object and the others of the store may go on: what they need is opened again."""
        self._state.release()

    def refresh(self) -> None:
        """Read what other processes have packed since this one last looked."""
        self._state.refresh()

    def forget(self) -> None:
        """Seal this process's pack and drop what it has read of the index (after an index was
        rewritten under it, as the tamper tests do)."""
        state = self._state
        with self._read_lock:
            self._read.clear()
        with state.lock:
            state.release()
            state.index.clear()
            state.read_upto.clear()
            state.loaded = False

    def hold(self) -> None:
        """Become a writer before deciding anything from the index (a recorder that dedups
        against stored blobs for a whole run): gc --blobs waits for every holder."""
        self._state.hold()

    def get(self, blob: str | BlobRef) -> bytes:
        """The blob's bytes, checked against its address."""
        address = blob.blob if isinstance(blob, BlobRef) else blob
        data = self._get(address, allow_list=True)
        with self._read_lock:
            self._read.keep(address[len(HASH_PREFIX) :], data)
        return data

    def _get(self, address: str, *, allow_list: bool, depth: int = 0, hashed: bool = True) -> bytes:
        """The blob's content; re-hashed unless ``hashed`` is False (a delta's base: the content
        built on it is hashed, and a mismatch reads the chain again, hashing every base, to name
        the one that is wrong)."""
        if not DIGEST_RE.match(address):
            raise BlobError(f"not a blob address: {address!r}")
        hexd = address[len(HASH_PREFIX) :]
        codec, stored = self._stored(hexd, address)
        if codec == blobcodec.CHUNKS:
            if not allow_list:
                raise BlobError(f"blob {address} is corrupted (a chunk is itself a chunk list)")
            data = self._join(address, stored, depth)
        elif codec == blobcodec.DELTA and not hashed:
            return self._undelta(address, stored, depth, hashed=False)  # errors go up to the first
        elif codec == blobcodec.DELTA:
            try:
                fast: bytes | None = self._undelta(address, stored, depth, hashed=False)
            except BlobError:
                fast = None
            if fast is not None and hashlib.sha256(fast).hexdigest() == hexd:
                return fast
            data = self._undelta(address, stored, depth, hashed=True)
        else:
            data = blobcodec.decode(codec, stored, DECODE_LIMIT, address)
        if not hashed:
            return data
        if hashlib.sha256(data).hexdigest() != hexd:
            raise BlobError(f"blob {address} is corrupted (content does not match its address)")
        return data

    def _stored(self, hexd: str, address: str) -> tuple[int, memoryview]:
        """A blob's codec and stored bytes, packed or loose (an old store); the index is read again
        when the blob was packed by another process, or repacked by gc, since this one read it."""
        entry = self._state.lookup(hexd)
        if entry is None:
            with contextlib.suppress(FileNotFoundError):
                raw = read_loose(self.root / hexd[:2] / hexd[2:], address)
                return loose_codec(raw), memoryview(raw)
        else:
            with contextlib.suppress(FileNotFoundError):
                return self.read_record(hexd, entry)
        self._state.refresh()
        entry = self._state.index.get(hexd)
        if entry is None:
            raise BlobError(f"blob {address} is missing from {self.root}")
        return self.read_record(hexd, entry)

    def _undelta(self, address: str, stored: memoryview, depth: int, *, hashed: bool) -> bytes:
        base_hex = blobcodec.delta_base(stored, address)
        if depth >= DELTA_READ_DEPTH:
            raise BlobError(f"blob {address} is corrupted (a delta chain deeper than {DELTA_READ_DEPTH})")
        try:
            with self._read_lock:
                kept = None if hashed else self._read.get(base_hex)  # wording an error: from disk
            base = (
                kept[0]
                if kept is not None
                else self._get(HASH_PREFIX + base_hex, allow_list=True, depth=depth + 1, hashed=hashed)
            )
        except BlobError as e:
            if depth or not hashed:  # worded once, by the delta that was asked for
                raise
            raise BlobError(f"blob {address} is corrupted (its delta base failed: {e})") from e
        return blobcodec.decode_delta(stored, base, DECODE_LIMIT, address)

    def _join(self, address: str, listing: bytes | memoryview, depth: int = 0) -> bytes:
        body = bytes(listing)
        if not body.startswith(CHUNK_MAGIC):
            raise BlobError(f"blob {address} is corrupted (a chunk list without its header)")
        try:
            return b"".join(
                self._get(line.decode(errors="replace"), allow_list=False, depth=depth + 1)
                for line in body[len(CHUNK_MAGIC) :].splitlines()
            )
        except BlobError as e:
            raise BlobError(f"blob {address} is corrupted (a chunk failed: {e})") from e

    def read_record(self, hexd: str, entry: packstore.Entry) -> tuple[int, memoryview]:
        """One pread of the record the index names, every range checked against the pack first."""
        where = f"pack {entry.pack}"
        fd = self._state.fd(entry.pack)
        size = os.fstat(fd).st_size
        if (
            entry.offset < len(packstore.PACK_MAGIC)
            or entry.length <= 0
            or entry.offset + entry.length > size
        ):
            raise BlobError(
                f"blob {HASH_PREFIX}{hexd} is corrupted ({where}: the index points outside the pack: "
                f"offset {entry.offset}, length {entry.length}, pack size {size})"
            )
        data = os.pread(fd, entry.length, entry.offset)
        if len(data) != entry.length:
            raise BlobError(f"blob {HASH_PREFIX}{hexd} is corrupted ({where}: short read)")
        codec, stored = packstore.parse_record(data, hexd, where)
        if codec != entry.codec or codec not in blobcodec.CODECS:
            raise BlobError(f"blob {HASH_PREFIX}{hexd} is corrupted ({where}: codec {codec!r} is wrong)")
        return codec, stored

    def check(self, blob: str) -> str | None:
        """None if the blob is present and intact, else the reason."""
        try:
            self.get(blob)
        except BlobError as e:
            return str(e)
        return None

    def pack_files(self) -> list[Path]:
        try:
            return sorted(self.packs_dir.glob("*" + packstore.PACK_SUFFIX))
        except FileNotFoundError:
            return []

    def loose_files(self) -> Iterator[Path]:
        """The loose blob files (a store written before packs), shard by shard."""
        for shard in sorted(self.root.glob("[0-9a-f][0-9a-f]")):
            if shard.is_dir():
                for path in sorted(shard.iterdir()):
                    if len(path.name) == 62 and not path.name.startswith("."):
                        yield path

    def usage(self) -> Usage:
        """Bytes the blobs take: apparent sizes and what the disk allocates, packs and loose files."""
        p = pb = pd = ib = idisk = lf = lb = ld = 0
        for path in self.pack_files():
            st = path.stat()
            p, pb, pd = p + 1, pb + st.st_size, pd + st.st_blocks * 512
            with contextlib.suppress(FileNotFoundError):
                sti = path.with_suffix(packstore.IDX_SUFFIX).stat()
                ib, idisk = ib + sti.st_size, idisk + sti.st_blocks * 512
        for path in self.loose_files():
            st = path.stat()
            lf, lb, ld = lf + 1, lb + st.st_size, ld + st.st_blocks * 512
        return Usage(p, pb, pd, ib, idisk, lf, lb, ld)

    def stored_bytes(self) -> int:
        """Bytes of stored blob data (packs, their indexes, loose files)."""
        u = self.usage()
        return u.pack_bytes + u.index_bytes + u.loose_bytes


def read_loose(path: Path, address: str) -> bytes:
    """The bytes of a loose blob file; ``FileNotFoundError`` when there is none, ``BlobError`` when
    what is there is no readable regular file (a folder, a FIFO, a device, a link to one)."""
    try:
        with os.fdopen(durable.open_regular(path), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise
    except OSError as e:
        why = "is not a regular file" if e.errno == errno.EINVAL else f"cannot be read: {e.strerror}"
        raise BlobError(f"blob {address} is corrupted (its file {why})") from None


def loose_codec(raw: bytes | memoryview) -> int:
    """The codec of a blob stored as a loose file or a run pack's record (no codec byte): a chunk
    list or a delta by their magic, else zlib."""
    head = bytes(raw[: max(len(CHUNK_MAGIC), len(blobcodec.DELTA_MAGIC))])
    if head.startswith(CHUNK_MAGIC):
        return blobcodec.CHUNKS
    if head.startswith(blobcodec.DELTA_MAGIC):
        return blobcodec.DELTA
    return blobcodec.ZLIB
