"""Spools after ingest: compressed with zstd, dropped, or kept as written (``AMB_SPOOLS``).

``compress`` (the default) rewrites a spool as ``<source>.spool.zst``; ``drop`` leaves an empty
``<source>.spool.dropped`` marker (a torn spool is compressed instead); ``keep`` leaves it. Only the
spools of finished runs whose size and last hash are what ingest stored are touched, never the
``recorder`` spool, and each step is crash-safe (docs/storage.md).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, NamedTuple

import duckdb
import zstandard

from replay.store import Store
from schemas import durable
from schemas.codec import hash_body
from schemas.durable import fsync_dir, write_durably
from schemas.errors import SpoolError, UsageError
from schemas.frames import COMPRESSED_SUFFIX, DROPPED_SUFFIX, scan

MODES = ("compress", "drop", "keep")
DEFAULT_MODE = "compress"
ENV = "AMB_SPOOLS"
COMPRESSED = COMPRESSED_SUFFIX
DROPPED = DROPPED_SUFFIX
KEPT_SOURCES = frozenset({"recorder"})
LEVEL = 1
"""zstd level: on spools, level 1 compresses better than 3, 6 or 9 (7.5x), and fastest."""
SETTLE_THREADS = 8
"""Spools compressed or dropped at once after an ingest (most of the time is waiting on fsync)."""


def mode(value: str | None = None) -> str:
    """The spool mode: ``value``, else $AMB_SPOOLS, else ``compress``; anything else is a usage error."""
    chosen = (value or os.environ.get(ENV) or DEFAULT_MODE).strip().lower()
    if chosen not in MODES:
        raise UsageError(f"spool mode {chosen!r} is not one of {', '.join(MODES)} (--spools or {ENV})")
    return chosen


def compressed_path(spool: Path) -> Path:
    return spool.with_name(spool.name + COMPRESSED)


def dropped_path(spool: Path) -> Path:
    return spool.with_name(spool.name + DROPPED)


def open_spool(path: Path) -> BinaryIO:
    """A spool file opened for reading; ``OSError`` at once when it is not a regular file
    (``durable.open_regular``: a FIFO, a device, a link to one, in a folder others can write)."""
    return os.fdopen(durable.open_regular(path), "rb")


def read_bytes(path: Path) -> bytes:
    """A spool's bytes, from the plain file or its ``.zst``."""
    with open_spool(path) as f:
        if path.name.endswith(COMPRESSED):
            return zstandard.ZstdDecompressor().stream_reader(f).read()
        return f.read()


DROPPED_HELD = b"(dropped)"
"""What ``held_bytes`` answers for a spool the store dropped after ingest: its events are in the
database, its bytes are gone (``stored_head`` tells what it was)."""


def held_bytes(spool: Path) -> bytes | None:
    """The bytes the store holds for one spool (its plain path), whichever form ingest left it in:
    kept, compressed, dropped (``DROPPED_HELD``); None when the store does not have it."""
    if spool.exists():
        return spool.read_bytes()
    if compressed_path(spool).exists():
        return read_bytes(compressed_path(spool))
    if dropped_path(spool).exists():
        return DROPPED_HELD
    return None


class Head(NamedTuple):
    """What identifies a spool's content once its bytes may be gone: its size, its frames and the
    hash of the last one (the chain makes that hash cover every frame before it)."""

    size: int
    frames: int
    last_hash: str | None


def stored_head(con: duckdb.DuckDBPyConnection, key: str) -> Head | None:
    """The ``Head`` of the spool ``key`` (``spool/<run>/<source>.spool``) as ingest loaded it; None
    when it never was."""
    rows = con.execute("SELECT size, frames, last_hash FROM spool_files WHERE path = ?", [key]).fetchall()
    return Head(int(rows[0][0]), int(rows[0][1]), rows[0][2]) if rows else None


def head_of(data: bytes, where: str) -> Head:
    """The ``Head`` of a spool's bytes."""
    bodies = scan(data, where).bodies
    return Head(len(data), len(bodies), hash_body(bytes(bodies[-1])) if bodies else None)


def differs(
    store_root: Path,
    run_id: str,
    held: dict[str, Path],
    incoming: dict[str, bytes],
    stored: Callable[[str], Head | None],
) -> str | None:
    """Why a run coming in (its spools' bytes by source) is not the run the store holds under its id
    (``held``: ``schemas.run_claim.held_spools``); None when it is that run, spool for spool, so
    loading it again adds nothing. A dropped spool is compared by its stored chain head
    (``stored(key)``: ``stored_head``)."""
    if set(held) != set(incoming):
        return f"the run coming in has spools of {', '.join(sorted(incoming))}"
    for source, data in sorted(incoming.items()):
        key = f"spool/{run_id}/{source}.spool"
        have = held_bytes(store_root / key)
        same = stored(key) == head_of(data, key) if have is DROPPED_HELD else have == data
        if not same:
            return f"the run coming in has another {source} spool"
    return None


def _compress(spool: Path, data: bytes) -> None:
    target = compressed_path(spool)
    packed = zstandard.ZstdCompressor(level=LEVEL, write_checksum=True).compress(data)
    if (
        hashlib.sha256(zstandard.ZstdDecompressor().decompress(packed)).digest()
        != hashlib.sha256(data).digest()
    ):
        raise OSError(f"{spool}: the compressed copy does not read back the same bytes")
    write_durably(target, packed)
    spool.unlink()
    fsync_dir(spool.parent)


def _drop(spool: Path) -> None:
    write_durably(dropped_path(spool), b"")
    spool.unlink()
    fsync_dir(spool.parent)


def settle(store: Store, how: str, progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
    """Compress or drop the spools of every finished, ingested run (see the module text).

    Returns how many spools were compressed and dropped."""
    done = {"compressed": 0, "dropped": 0}
    if how == "keep":
        return done
    candidates = [
        row
        for row in store.con.execute(
            "SELECT f.path, f.run_id, f.source, f.size, f.torn_bytes, f.frames, f.last_hash "
            "FROM spool_files f SEMI JOIN manifests m ON m.run_id = f.run_id ORDER BY f.path"
        ).fetchall()
        if row[2] not in KEPT_SOURCES and (store.root / row[0]).exists()
    ]
    if not candidates:
        return done
    import pyarrow as pa  # here: the commands that import this module only to read spools need no Arrow

    # What the store holds for each candidate (only theirs: this runs after every ingest).
    store.con.register(
        "_amb_settle", pa.table({"run_id": [r[1] for r in candidates], "source": [r[2] for r in candidates]})
    )
    try:
        held = {
            (run, source): (n, last)
            for run, source, n, last in store.con.execute(
                "SELECT e.run_id, e.source, count(*), arg_max(e.hash, e.seq) FROM events e "
                "SEMI JOIN _amb_settle c ON c.run_id = e.run_id AND c.source = e.source GROUP BY ALL"
            ).fetchall()
        }
    finally:
        store.con.unregister("_amb_settle")
    todo = [
        (key, size, torn, frames, last, *held.get((run, source), (None, None)))
        for key, run, source, size, torn, frames, last in candidates
    ]

    def settle_one(item: tuple[str, int, int, int, str, int | None, str | None]) -> str | None:
        key, size, torn, frames, last_hash, n, stored_last = item
        spool = store.root / key
        try:
            data = spool.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) != size or n != frames or last_hash != stored_last:
            return None  # changed since it was loaded, or not all of it is stored: the next ingest says why
        try:
            bodies = scan(data, key).bodies
        except SpoolError:
            return None
        if len(bodies) != frames or (bodies and hash_body(bytes(bodies[-1])) != stored_last):
            return None
        if how == "drop" and not torn:
            _drop(spool)
            return "dropped"
        _compress(spool, data)
        return "compressed"

    # Each spool is its own crash-safe sequence of writes and fsyncs; on several threads the fsyncs
    # of different spools overlap (the filesystem commits them together) instead of queueing.
    with ThreadPoolExecutor(SETTLE_THREADS, thread_name_prefix="amb-settle") as pool:
        for i, what in enumerate(pool.map(settle_one, todo)):
            if progress and i % 100 == 0:
                progress(i, len(todo))
            if what is not None:
                done[what] += 1
    if progress:
        progress(len(todo), len(todo))
    return done
