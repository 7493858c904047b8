"""Bringing runs home: shards (``sweeps.shard``) and other stores, loaded into one store in bulk,
idempotently, each checked before one byte of it is copied (``replay.shard_check``), then loaded by
one ``replay.ingest.ingest``. A run id the store holds already is loaded only if it is this very
run, spool for spool; another run under that id is refused as ``RunExists``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zstandard

from replay import spools
from replay.ingest import IngestReport, ingest
from replay.shard_check import SPOOL_RE, Checked, ShardError, ShardSizes, check_shard, check_store_run
from replay.store import Store
from schemas.blob import HASH_PREFIX
from schemas.blobpack import read_records
from schemas.blobstore import BlobStore
from schemas.codec import ID_RE
from schemas.durable import read_small, write_durably
from schemas.errors import AmbError, BlobError, RunExists, SpoolError
from schemas.run_claim import held_spools, taken_message


@dataclass
class LoadReport:
    loaded: list[str] = field(default_factory=list)
    """Run ids whose shard was checked and brought into the store (new or already there)."""
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(shard path, why): nothing of it was copied."""
    spools_copied: int = 0
    blobs_copied: int = 0
    ingest: IngestReport | None = None
    taken: list[str] = field(default_factory=list)
    """Shards of ``refused`` whose run id the store holds for a different run (bad input)."""

    def refuse(self, where: str, error: ShardError, root: Path) -> None:
        why = str(error).removeprefix(f"{where}: ").removeprefix(f"{root}: ")  # the report names it
        self.refused.append((where, why))
        if isinstance(error, RunExists):
            self.taken.append(where)


Stored = Callable[[str], spools.Head | None]
"""The ``Head`` of a spool the store loaded, by key (``replay.spools.stored_head``)."""

TAKEN_WAY_OUT = (
    "load it into another store (--store DIR), or rename it on the way in: `amb export atif RUN` "
    "from its own store, then `amb import atif` of that folder with --run-id NEW"
)


class ShardTaken(ShardError, RunExists):
    """A shard or run whose id the store holds for a different run (exit code 2, as ``RunExists``)."""


def _taken(store_root: Path, shard: Checked, contents: dict[Path, bytes], stored: Stored) -> None:
    """``ShardTaken`` when the store holds the shard's run id for another run; nothing when the id
    is free or holds this very run (loading a shard again adds nothing)."""
    held = held_spools(store_root, shard.run_id)
    if not held:
        return
    incoming = {p.name.removesuffix(".spool"): d for p, d in contents.items() if p.name.endswith(".spool")}
    why = spools.differs(store_root, shard.run_id, held, incoming, stored)
    if why is not None:
        raise ShardTaken(taken_message(store_root, shard.run_id, held, TAKEN_WAY_OUT, why))


def _copy_batch(
    store_root: Path, batch: list[Checked], report: LoadReport, stored: Stored
) -> list[tuple[Checked, ShardError]]:
    """Checked shards into the store: every shard's blobs, made durable by one flush, then their
    spools, so a kill leaves blobs without spools, never a spool without its blobs. Returns the
    shards refused here (``ShardTaken``), of which nothing is copied."""
    refused: list[tuple[Checked, ShardError]] = []
    ready: list[tuple[Checked, dict[Path, bytes]]] = []
    blobs = BlobStore(store_root / "blobs")
    for shard in batch:
        try:
            contents = {
                path: shard.data.get(path) or path.read_bytes() for path in shard.spools + shard.packs
            }
            _taken(store_root, shard, contents, stored)
            _all_blobs_there(shard, contents, blobs)
            for hexd, path in shard.blobs:
                raw = shard.blob_data.get(hexd)
                if blobs.put_stored(hexd, raw if raw is not None else path.read_bytes(), sync=False):
                    report.blobs_copied += 1
            for hexd, (codec, record) in shard.records.items():
                if blobs.put_stored(hexd, record, sync=False, codec=codec):
                    report.blobs_copied += 1
        except ShardError as e:
            refused.append((shard, e))
        except (BlobError, OSError, SpoolError) as e:
            refused.append((shard, ShardError(str(e))))
        else:
            ready.append((shard, contents))
    blobs.flush()  # durable before the spools that name them exist
    # The spools last: once they are in, the run is visible to ingest, and its blobs are there.
    for shard, contents in ready:
        target_dir = store_root / "spool" / shard.run_id
        there = _names(target_dir)
        if not there:
            target_dir.mkdir(parents=True, exist_ok=True)
        for path, data in contents.items():
            target = target_dir / path.name
            if not there or spools.held_bytes(target) is None:
                write_durably(target, data)
                report.spools_copied += 1
    return refused


_BLOB_REF = re.compile(rb'"blob":"sha256:([0-9a-f]{64})"')
"""A blob reference in a spool's event (as ``replay.manifest.BLOB_REF_SQL`` finds it when stored)."""


def _all_blobs_there(shard: Checked, contents: dict[Path, bytes], target: BlobStore) -> None:
    """``ShardError`` naming the first blob an event of the shard refers to that neither the shard
    (its checked blobs, the packs a recorder left beside its spools) nor the store holds: loaded,
    the run would fail ``amb verify`` and every read of that content."""
    there = {hexd for hexd, _path in shard.blobs} | set(shard.records)
    for pack in shard.packs:
        try:
            records, _torn = read_records(contents[pack], pack.name)
        except SpoolError as e:
            raise ShardError(str(e)) from None
        there.update(hexd for hexd, _stored in records)
    for path in shard.spools:
        for ref in dict.fromkeys(_BLOB_REF.findall(contents[path])):
            hexd = ref.decode()
            if hexd not in there and not target.has(hexd):
                rel = path.relative_to(shard.root).as_posix()
                raise ShardError(
                    f"{shard.root}: {rel}: an event refers to blob {HASH_PREFIX}{hexd}, "
                    "which neither it nor the store holds"
                )


def _names(directory: Path) -> set[str]:
    """What a folder holds (empty when it does not exist): one look instead of three per spool."""
    try:
        return set(os.listdir(directory))
    except FileNotFoundError:
        return set()


def _already_in(store_root: Path, shard: Path, run_id: str, stored: Stored) -> bool:
    """Whether the store already holds this shard's run, by the sizes its shard.json lists (spools
    are append-only and were checked when copied in, so equal sizes mean equal files; a dropped
    spool is compared by the size ingest recorded)."""
    try:
        meta = msgspec.json.decode(read_small(shard / "shard.json"), type=ShardSizes)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return False
    if meta.run_id != run_id or not ID_RE.match(run_id):
        return False
    wanted = {rel: size for rel, size in meta.files.items() if SPOOL_RE.match(rel)}
    held = held_spools(store_root, run_id)
    if not wanted or {Path(rel).name.removesuffix(".spool") for rel in wanted} != set(held):
        return False
    for rel, size in wanted.items():
        try:
            have = spools.held_bytes(store_root / rel)
        except (OSError, zstandard.ZstdError):
            return False
        if have is spools.DROPPED_HELD:
            head = stored(rel)
            if head is None or head.size != size:
                return False
        elif have is None or len(have) != size:
            return False
    return True


BATCH_SHARDS = 64
"""Shards checked and copied together: their blobs made durable by one flush (``_copy_batch``)."""
CHECK_THREADS = 4
"""Shards checked at once: reading files and hashing overlap (hashlib and zlib release the GIL)."""


def load_shards(
    store_dir: str | os.PathLike[str],
    shards: list[tuple[Path, str]],
    *,
    progress: Callable[[int, int], None] | None = None,
    spool_mode: str | None = None,
) -> LoadReport:
    """Check and load ``(shard dir, run id)`` pairs into the store (idempotent); refused shards are
    reported. Shards go in batches of ``BATCH_SHARDS``, then one ingest loads every new spool."""
    report = LoadReport()
    st = Store.open(store_dir)
    have_blob = BlobStore(st.root / "blobs").has
    stored = _stored_heads(st)

    def check_one(pair: tuple[Path, str]) -> Checked | ShardError | None:
        """The checked shard; None when the store holds it already; why it is refused."""
        root, run_id = pair
        try:
            if _already_in(st.root, root, run_id, stored):
                return None
            return check_shard(root, run_id, have_blob=have_blob)
        except ShardError as e:
            return e
        except BlobError as e:
            return ShardError(str(e))

    try:
        with ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="amb-shard-check") as pool:
            for start in range(0, len(shards), BATCH_SHARDS):
                batch = shards[start : start + BATCH_SHARDS]
                outcomes = list(pool.map(check_one, batch))
                checked = [c for c in outcomes if isinstance(c, Checked)]
                refused = {id(shard): e for shard, e in _copy_batch(st.root, checked, report, stored)}
                for (root, run_id), outcome in zip(batch, outcomes, strict=True):
                    if isinstance(outcome, Checked):
                        outcome = refused.get(id(outcome))
                    if outcome is None:
                        report.loaded.append(run_id)
                    else:
                        report.refuse(str(root), outcome, root)
                if progress is not None:
                    progress(start + len(batch), len(shards))
        if report.loaded:
            _ingest(st, report, spool_mode)
    finally:
        st.close()
    return report


def _stored_heads(st: Store) -> Stored:
    """``replay.spools.stored_head`` on the store's connection, safe to call from the check threads."""
    lock = threading.Lock()

    def stored(key: str) -> spools.Head | None:
        with lock:
            return spools.stored_head(st.con, key)

    return stored


def _ingest(st: Store, report: LoadReport, spool_mode: str | None) -> None:
    """One ingest of every loaded run; spools the store's own checks refuse are reported as refused.
    ``spool_mode``: what becomes of the copied spools afterwards (``replay.spools``)."""
    try:
        report.ingest = ingest(store=st, run_ids=report.loaded, spool_mode=spool_mode)
    except AmbError as e:
        partial = getattr(e, "report", None)
        if partial is None:
            raise
        report.ingest = partial
        for path, why in partial.failed:
            report.refused.append((path, why))
            run_id = Path(path).parent.name
            if run_id in report.loaded:
                report.loaded.remove(run_id)


def merge_store(
    store_dir: str | os.PathLike[str],
    source: Path,
    *,
    progress: Callable[[int, int], None] | None = None,
    spool_mode: str | None = None,
) -> LoadReport:
    """Load every run of the store ``source`` into this one, with the same checks as shards."""
    report = LoadReport()
    source = Path(source)
    if Path(store_dir).resolve() == source.resolve():
        raise ShardError(f"{source}: is the store itself")
    spool = source / "spool"
    if not spool.is_dir() or spool.is_symlink():
        raise ShardError(f"{source}: not a store (no spool/ folder)")
    runs = [p.name for p in sorted(spool.iterdir())]
    st = Store.open(store_dir)
    stored = _stored_heads(st)
    try:
        blobs_done = False
        for i, run_id in enumerate(runs):
            try:
                # The runs share the source's blobs/: checked (and copied) with the first run.
                checked = check_store_run(source, run_id, with_blobs=not blobs_done)
                refused = _copy_batch(st.root, [checked], report, stored)
                if refused:
                    raise refused[0][1]
                blobs_done = True
            except ShardError as e:
                report.refuse(f"{source}/spool/{run_id}", e, source)
            except BlobError as e:
                report.refuse(f"{source}/spool/{run_id}", ShardError(str(e)), source)
            else:
                report.loaded.append(run_id)
            if progress is not None:
                progress(i + 1, len(runs))
        if report.loaded:
            _ingest(st, report, spool_mode)
    finally:
        st.close()
    return report
