"""``amb gc --blobs``: drop the blobs nothing refers to, by rewriting (repacking) packs.

Kept (the *live* set): every ``sha256:<hex>`` in a file under ``spool/``, read *before* the database
(an ingest that commits and then drops its spools in between is seen on one side or the other),
then in event payloads and every other text column, and the parts of live chunk lists and deltas.
Writers hold the store's writers' lock shared; gc holds it exclusively (waiting up to ``wait_s``).
A pack rewritten keeps every live record re-hashed, and goes only once the new one is fsync'd; a
pack holding a damaged copy of a live blob is left as it is and named (docs/blob-packs.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, NamedTuple

import duckdb
import zstandard

from schemas import blobcodec, packstore
from schemas.blobstore import CHUNK_MAGIC, DECODE_LIMIT, WRITERS_LOCK, BlobStore, read_loose
from schemas.errors import BlobError
from schemas.frames import COMPRESSED_SUFFIX

SMALL_PACK = 8 * 1024 * 1024
_ADDRESS = re.compile(rb"sha256:([0-9a-f]{64})")
_ADDRESS_SQL = "sha256:([0-9a-f]{64})"


class Collected(NamedTuple):
    live: int
    removed: int
    """Blobs (records or loose files) dropped: unreferenced or a second copy."""
    reclaimed: int
    """Bytes freed on disk (apparent sizes). A pack that had lost its index is counted with the index
    it should have had: writing that index again repairs the store, and is no cost of collecting."""
    packs_before: int
    packs_after: int
    problems: list[str]
    indexes_rebuilt: int = 0
    """Packs without their index (a gc killed between removing the two) rewritten into one that has it."""


def spool_references(spool_dir: Path) -> set[str]:
    """Every address written in any file under ``spool/`` (spools, run packs, compacted spools),
    a compressed spool's read through its decompression: a run's spools are the record of what its
    blobs are, whatever the database holds. A compressed spool that cannot be read stops gc."""
    live: set[str] = set()
    for path in sorted(spool_dir.rglob("*")) if spool_dir.exists() else []:
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                if not path.name.endswith(COMPRESSED_SUFFIX):
                    _read_references(f, live)
                    continue
                try:
                    _read_references(zstandard.ZstdDecompressor().stream_reader(f), live)
                except zstandard.ZstdError as e:
                    raise BlobError(
                        f"{path}: cannot decompress ({e}); gc removes nothing while a spool's "
                        "references cannot be read"
                    ) from None
    return live


def _read_references(f: BinaryIO, live: set[str]) -> None:
    tail = b""
    while block := f.read(1 << 24):
        block = tail + block
        live.update(m.decode() for m in _ADDRESS.findall(block))
        tail = block[-70:]  # an address cut by the block boundary


def database_references(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Every address in an event payload or in any text column of any other base table."""
    parts = []
    tables = con.execute(
        "SELECT table_name, column_name FROM information_schema.columns c JOIN information_schema.tables t "
        "USING (table_schema, table_name) WHERE t.table_type = 'BASE TABLE' AND t.table_schema = 'main' "
        "AND (c.data_type = 'VARCHAR' OR c.data_type = 'JSON')"
    ).fetchall()
    if ("events", "payload") not in tables:
        raise BlobError(
            "the store's database has no events table (it is damaged): gc removes nothing; "
            "`amb verify` says more"
        )
    for table, column in tables:
        if table == "events" and column != "payload":
            continue  # hash and prev_hash are event hashes, not blobs
        parts.append(
            f"SELECT unnest(regexp_extract_all(CAST(\"{column}\" AS VARCHAR), '{_ADDRESS_SQL}', 1)) AS h "
            f'FROM "{table}" WHERE contains(CAST("{column}" AS VARCHAR), \'sha256:\')'
        )
    if not parts:
        return set()
    return {r[0] for r in con.execute(" UNION ".join(parts)).fetchall()}


def _take_exclusive(root: Path, wait_s: float) -> int:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / WRITERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise BlobError(
                    f"blob writers are active in {root} (a recording, ingest, import or migration); "
                    "run gc --blobs when they have finished"
                ) from None
            time.sleep(0.1)


def collect(
    blobs: BlobStore,
    spool_dir: Path,
    con_factory: Callable[[], duckdb.DuckDBPyConnection],
    *,
    wait_s: float = 30.0,
    small_pack: int = SMALL_PACK,
) -> Collected:
    """Remove unreferenced blobs. ``con_factory`` opens the store's database once the lock is held."""
    blobs.close()  # this process's own writer and lock: gc needs them exclusively
    lock = _take_exclusive(blobs.root, wait_s)
    try:
        live = spool_references(spool_dir)
        con = con_factory()
        try:
            live |= database_references(con)
        finally:
            con.close()
        return _collect(blobs, live, small_pack)
    finally:
        os.close(lock)


def _listing_chunks(listing: bytes) -> list[str]:
    return [m.decode() for m in _ADDRESS.findall(listing[len(CHUNK_MAGIC) :])]


def _add_parts(blobs: BlobStore, live: set[str]) -> None:
    """Add to ``live`` what its blobs are made of: the chunks of chunk lists and the bases of
    deltas, and theirs in turn (a delta's base may itself be a delta or a chunk list)."""
    todo = list(live)
    while todo:
        hexd = todo.pop()
        entry = blobs.entry(hexd)
        parts: list[str] = []
        try:
            if entry is not None and entry.codec == blobcodec.CHUNKS:
                parts = _listing_chunks(bytes(blobs.read_record(hexd, entry)[1]))
            elif entry is not None and entry.codec == blobcodec.DELTA:
                parts = [blobcodec.delta_base(blobs.read_record(hexd, entry)[1], hexd)]
            elif entry is None:
                raw = read_loose(blobs.root / hexd[:2] / hexd[2:], "sha256:" + hexd)
                parts = _listing_chunks(raw) if raw.startswith(CHUNK_MAGIC) else []
        except (FileNotFoundError, BlobError):
            parts = []  # missing, or damaged: verify names it; its parts are kept below by address if seen
        for part in parts:
            if part not in live:
                live.add(part)
                todo.append(part)


def _collect(blobs: BlobStore, live: set[str], small_pack: int) -> Collected:
    blobs.refresh()
    _add_parts(blobs, live)
    packs = blobs.pack_files()
    problems: list[str] = []
    kept: set[str] = set()
    plans: list[tuple[Path, set[int], int]] = []  # pack, offsets of the records it keeps, records dropped
    lost_indexes: dict[Path, int] = {}  # a pack rewritten without its index: the size that index had
    small = {p for p in packs if p.stat().st_size < small_pack}
    for path in packs:
        if packstore.is_open(path):  # a writer's (none should be, with the lock held): untouched
            kept.update(r.hexd for r in packstore.scan(path))
            continue
        keep: set[int] = set()
        whole: set[tuple[int, int]] = set()
        records, end, damaged = 0, len(packstore.PACK_MAGIC), False
        for r in packstore.scan(path):
            records, end = records + 1, r.offset + r.length
            whole.add((r.offset, r.length))
            if r.hexd in live and r.hexd not in kept:
                try:
                    _check_record(r)  # a damaged copy never counts as the one kept
                except BlobError as e:
                    problems.append(f"{path.name} left as it is: {e}")
                    damaged = True
                    continue
                keep.add(r.offset)
                kept.add(r.hexd)
        cut = _live_entries_cut(path, whole, live, kept)
        if cut is not None:
            problems.append(f"{path.name} left as it is: {cut}")
            damaged = True
        dead = records - len(keep)
        torn = path.stat().st_size > end
        # A pack without its index (a gc killed between removing the two) is invisible to readers:
        # the copies counted as kept from it must be rewritten into an indexed pack.
        unindexed = not path.with_suffix(packstore.IDX_SUFFIX).exists()
        if not damaged and (dead or torn or unindexed or (len(small) > 1 and path in small)):
            plans.append((path, keep, dead))
            if unindexed:
                lost_indexes[path] = len(packstore.IDX_MAGIC) + records * packstore.ENTRY.size
    writer: packstore.PackWriter | None = None
    removed = reclaimed = 0
    rewritten: list[Path] = []
    for path, keep, dead in plans:
        kept_records = [r for r in packstore.scan(path) if r.offset in keep]
        if kept_records and writer is None:
            writer = packstore.PackWriter(blobs.packs_dir)
        for r in kept_records:
            assert writer is not None
            writer.append(r.hexd, r.codec, r.stored, sync=False)
        rewritten.append(path)
        removed += dead
    if writer is not None:
        writer.close()  # fsyncs the pack, then its index, then the directory
        reclaimed -= writer.size + writer.idx_path.stat().st_size
    for path in rewritten:
        idx = path.with_suffix(packstore.IDX_SUFFIX)
        reclaimed += path.stat().st_size + (idx.stat().st_size if idx.exists() else lost_indexes.get(path, 0))
        idx.unlink(missing_ok=True)  # the index first: no entry ever points into a removed pack
        path.unlink()
    for path in list(blobs.loose_files()):
        hexd = path.parent.name + path.name
        if hexd in live:
            continue
        if path.is_dir() and not path.is_symlink():
            problems.append(f"{hexd[:2]}/{hexd[2:]} left as it is: a folder where a blob file goes")
            continue
        reclaimed += path.lstat().st_size
        path.unlink()
        removed += 1
    blobs.close()
    blobs.refresh()
    after = len(blobs.pack_files())
    return Collected(len(live), removed, reclaimed, len(packs), after, problems, len(lost_indexes))


def _live_entries_cut(path: Path, whole: set[tuple[int, int]], live: set[str], kept: set[str]) -> str | None:
    """Why the pack holds a damaged copy of a live blob that no pack gave whole: an entry of its
    index pointing where the scan found no whole record (a pack cut short, or its bytes changed).
    A writer killed mid-record leaves a torn tail that no entry points to: never a reason here."""
    idx = path.with_suffix(packstore.IDX_SUFFIX)
    if not idx.exists():
        return None
    entries, _end = packstore.read_index(idx)
    for hexd, offset, length, _codec in entries:
        if hexd in live and hexd not in kept and (offset, length) not in whole:
            return (
                f"blob sha256:{hexd} is corrupted (its index entry, offset {offset} and length {length}, "
                "points at no whole record of the pack)"
            )
    return None


def _check_record(r: packstore.Record) -> None:
    if r.codec == blobcodec.CHUNKS:
        if not bytes(r.stored[: len(CHUNK_MAGIC)]) == CHUNK_MAGIC:
            raise BlobError(f"blob sha256:{r.hexd} is corrupted (a chunk list without its header)")
        return
    if r.codec == blobcodec.DELTA:  # its content needs its base: the header is checked here
        blobcodec.delta_base(r.stored, "sha256:" + r.hexd)
        return
    data = blobcodec.decode(r.codec, r.stored, DECODE_LIMIT, "sha256:" + r.hexd)
    if hashlib.sha256(data).hexdigest() != r.hexd:
        raise BlobError(f"blob sha256:{r.hexd} is corrupted (content does not match its address)")
