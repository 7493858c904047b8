"""Bringing runs home: shards (one run's spools and blobs, ``sweeps.shard``) and other stores, loaded
into one store in bulk, idempotently, with verification.

A shard directory comes from a shared filesystem that anything on the cluster could have written,
so it is checked before one byte of it is copied: no symlinks or special files anywhere; only the
layout ``spool/<run id>/<source>.spool``, ``blobs/<2 hex>/<62 hex>``, ``shard.json``/``exec.json``;
one run, the expected one (the directory's name, its ``shard.json``, its spool folder and every
event's envelope agree); every file exactly the size ``shard.json`` recorded (a truncated spool or
blob is refused, not loaded as a torn tail); every frame's length and checksum, and every blob's
content against its address. A refused shard is named with its reason and nothing of it is copied.

Then its spools are copied into ``spool/<run id>/`` of the store, its blobs into ``blobs/``
(write-once), and one ``replay.ingest.ingest`` call loads every new spool with the store's own checks
(hash chains, sequences, known kinds). A run id the store already holds (``schemas.run_claim``) is
loaded only if the store holds this very run, spool for spool (re-loading adds nothing); a different
run under that id is refused as ``RunExists`` (runs are never merged or reused in place)."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zstandard

from replay import spools
from replay.ingest import IngestReport, ingest
from replay.store import Store
from schemas.blob import HASH_PREFIX
from schemas.blobstore import CHUNK_MAGIC, BlobStore
from schemas.codec import ID_RE, SOURCES
from schemas.durable import write_durably
from schemas.errors import AmbError, BlobError, RunExists, SpoolError
from schemas.frames import scan
from schemas.run_claim import held_spools, taken_message

SPOOL_RE = re.compile(r"^spool/([^/]+)/([A-Za-z0-9._:-]+)\.spool$")
PACK_RE = re.compile(r"^spool/([^/]+)/([A-Za-z0-9._:-]+)\.blobs$")
"""A blob pack a recorder that died left beside its spool: ingest moves its blobs into ``blobs/``."""
BLOB_RE = re.compile(r"^blobs/([0-9a-f]{2})/([0-9a-f]{62})$")
PACKFILE_RE = re.compile(r"^blobs/packs/[0-9a-f]{16}-[0-9]+-[0-9a-f]{6}\.(pack|idx)$")
"""The blob store's packs and their indexes (``schemas.packstore``): how a recorder stores blobs."""
WRITERS_LOCK_REL = "blobs/.writers.lock"
"""The blob writers' (empty) lock file: part of a store's layout, never copied."""
SHARD_META = ("shard.json", "exec.json")


class ShardError(AmbError):
    """A shard (or a source store's run) that is refused; the message names it and says why."""


class _Envelope(msgspec.Struct):
    run_id: str


class _Sizes(msgspec.Struct):
    run_id: str
    files: dict[str, int]


_envelope = msgspec.json.Decoder(_Envelope)


@dataclass
class Checked:
    """A shard that passed its checks: what to copy."""

    root: Path
    run_id: str
    spools: list[Path] = field(default_factory=list)
    packs: list[Path] = field(default_factory=list)
    data: dict[Path, bytes] = field(default_factory=dict)
    """Each spool's bytes as checked: what is copied is exactly what was checked."""
    blob_data: dict[str, bytes] = field(default_factory=dict)
    """Each loose blob's stored bytes as checked, by address."""
    records: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """Each packed blob's (codec, stored bytes) as checked, by address: copied record for record."""
    blobs: list[tuple[str, Path]] = field(default_factory=list)
    """(hex address, file) of every blob file."""


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
        self.refused.append((where, _without(str(error), root)))
        if isinstance(error, RunExists):
            self.taken.append(where)


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``root`` (relative POSIX path, lstat), refusing symlinks and special files."""
    out: list[tuple[str, os.stat_result]] = []
    base = str(root)
    cut = len(base) + 1
    stack = [base]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                rel = entry.path[cut:]
                if stat.S_ISLNK(st.st_mode):
                    raise ShardError(f"{root}: {rel} is a symbolic link (a shard holds only its own files)")
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    out.append((rel, st))
                else:
                    raise ShardError(f"{root}: {rel} is not a regular file or folder")
    return out


def check_shard(
    root: Path, run_id: str, *, sized: bool = True, have_blob: Callable[[str], bool] | None = None
) -> Checked:
    """Check one shard of ``run_id`` (see the module's docstring); raises ``ShardError``.

    ``sized``: the shard has a ``shard.json`` listing every file's size (a sweep's shard); False for
    a run taken from another store (whose spools may still grow; a torn tail is refused all the same).
    ``have_blob(hex)``: blobs the target store already holds are neither checked again nor copied.
    """
    if not ID_RE.match(run_id):
        raise ShardError(f"{root}: {run_id!r} is not a run id")
    try:
        st = os.lstat(root)
    except OSError as e:
        raise ShardError(f"{root}: cannot read: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ShardError(f"{root}: not a folder (a symbolic link or a file)")
    try:
        entries = _walk(root)
    except OSError as e:
        raise ShardError(f"{root}: cannot read: {e.strerror or e}") from None
    checked = Checked(root, run_id)
    sizes: dict[str, int] | None = None
    if sized:
        try:
            meta = msgspec.json.decode((root / "shard.json").read_bytes(), type=_Sizes)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ShardError(f"{root}: no readable shard.json ({e})") from None
        if meta.run_id != run_id:
            raise ShardError(f"{root}: shard.json claims run {meta.run_id!r}, the shard is run {run_id!r}")
        sizes = meta.files
        for rel in sizes:
            if not (_store_file(rel) or rel in SHARD_META):
                raise ShardError(f"{root}: shard.json lists {rel!r}, which is not a shard's file")
    present = {}
    has_packs = False
    for rel, st in entries:
        present[rel] = st.st_size
        m = SPOOL_RE.match(rel)
        if m:
            if m.group(1) != run_id:
                raise ShardError(f"{root}: holds spools of run {m.group(1)!r}, the shard is run {run_id!r}")
            if m.group(2) not in SOURCES:
                raise ShardError(f"{root}: {rel}: unknown source {m.group(2)!r}")
            checked.spools.append(root / rel)
            continue
        p = PACK_RE.match(rel)
        if p:
            if p.group(1) != run_id:
                raise ShardError(
                    f"{root}: holds a blob pack of run {p.group(1)!r}, the shard is run {run_id!r}"
                )
            checked.packs.append(root / rel)
            continue
        b = BLOB_RE.match(rel)
        if b:
            checked.blobs.append((b.group(1) + b.group(2), root / rel))
            continue
        if rel in SHARD_META or rel == WRITERS_LOCK_REL:
            continue
        if PACKFILE_RE.match(rel):
            has_packs = True
            continue
        raise ShardError(
            f"{root}: {rel} is not part of a shard (spool/<run>/<source>.spool, blobs/, shard.json)"
        )
    if sizes is not None:
        for rel, size in sizes.items():
            if rel not in present:
                raise ShardError(f"{root}: {rel} is missing (shard.json lists it)")
            if present[rel] != size:
                raise ShardError(
                    f"{root}: {rel} is {present[rel]} bytes, shard.json says {size}: "
                    + ("truncated" if present[rel] < size else "it grew after the run")
                )
        extra = sorted(set(present) - set(sizes) - set(SHARD_META))
        if extra:
            raise ShardError(f"{root}: {extra[0]} is not listed in shard.json")
    if not checked.spools:
        raise ShardError(f"{root}: no spool of run {run_id!r}")
    for path in checked.spools:
        checked.data[path] = _check_spool(root, path, run_id)
    if have_blob is not None:
        checked.blobs = [(hexd, path) for hexd, path in checked.blobs if not have_blob(hexd)]
    source_blobs = BlobStore(root / "blobs")
    for hexd, path in checked.blobs:
        checked.blob_data[hexd] = _verified_blob(root, source_blobs, hexd, path)
    if has_packs:
        _check_packed(root, source_blobs, checked, have_blob)
    return checked


def _store_file(rel: str) -> bool:
    return (
        bool(SPOOL_RE.match(rel) or PACK_RE.match(rel) or BLOB_RE.match(rel) or PACKFILE_RE.match(rel))
        or rel == WRITERS_LOCK_REL
    )


def _check_packed(
    root: Path, source: BlobStore, checked: Checked, have_blob: Callable[[str], bool] | None
) -> None:
    """Every blob the source's packs index (those the target lacks): checked whole against its
    address (a chunk list with all its chunks), then kept as its stored record. The index is read
    with every range checked against its pack, so a lying index fails here, naming the blob."""
    try:
        addresses = source.addresses()
    except (BlobError, OSError) as e:
        raise ShardError(f"{root}: blobs/packs: cannot read the index: {e}") from None
    for hexd in addresses:
        if have_blob is not None and have_blob(hexd):
            continue
        reason = source.check(HASH_PREFIX + hexd)
        if reason is not None:
            raise ShardError(f"{root}: {reason}")
        try:
            codec, stored = source.stored_record(hexd)
        except BlobError as e:
            raise ShardError(f"{root}: {e}") from None
        checked.records[hexd] = (codec, bytes(stored))


def _verified_blob(root: Path, source: BlobStore, hexd: str, path: Path) -> bytes:
    """A blob file's bytes, once its content was checked against its address. The common case (one
    zlib stream) is checked on the bytes read; anything else by the blob store's own reader."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ShardError(f"{root}: blobs/{hexd[:2]}/{hexd[2:]}: cannot read: {e.strerror or e}") from None
    if not raw.startswith(CHUNK_MAGIC):
        try:
            if hashlib.sha256(zlib.decompress(raw)).hexdigest() == hexd:
                return raw
        except zlib.error:
            pass
    reason = source.check(HASH_PREFIX + hexd)
    if reason is not None:
        raise ShardError(f"{root}: {reason}")
    return raw


def _check_spool(root: Path, path: Path, run_id: str) -> bytes:
    """A spool's bytes, checked: whole frames, every event of this run. ``path`` may name a spool
    another store compressed after ingest (``<source>.spool`` then reads ``<source>.spool.zst``)."""
    rel = path.relative_to(root).as_posix()
    try:
        data = path.read_bytes() if path.exists() else spools.read_bytes(spools.compressed_path(path))
        result = scan(data, rel)
    except SpoolError as e:
        raise ShardError(f"{root}: {e}") from None
    except OSError as e:
        raise ShardError(f"{root}: {rel}: cannot read: {e.strerror or e}") from None
    except zstandard.ZstdError as e:
        raise ShardError(f"{root}: {rel}{spools.COMPRESSED}: cannot decompress: {e}") from None
    if result.tail is not None:
        raise ShardError(f"{root}: {rel} is truncated ({result.tail.why} at byte {result.tail.offset})")
    for body in result.bodies:
        try:
            claimed = _envelope.decode(body).run_id
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ShardError(f"{root}: {rel}: an event without a readable envelope") from None
        if claimed != run_id:
            raise ShardError(f"{root}: {rel}: an event of run {claimed!r} in the shard of run {run_id!r}")
    return data


def _copy_in(store_root: Path, shard: Checked, report: LoadReport, stored: Stored) -> None:
    """One checked shard into the store (see :func:`_copy_batch`); raises ``ShardError``."""
    refused = _copy_batch(store_root, [shard], report, stored)
    if refused:
        raise refused[0][1]


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
    """Checked shards into the store: first every shard's blobs, made durable by one flush for the
    whole batch, then their spools. A spool exists in the store only once every blob it names is on
    disk, so a kill at any point leaves blobs without spools (harmless: loading again finds them
    there), never a spool without its blobs. Returns the shards refused here with the reason
    (``ShardTaken``: the store holds their run id for a different run); nothing of those is copied."""
    refused: list[tuple[Checked, ShardError]] = []
    ready: list[tuple[Checked, dict[Path, bytes]]] = []
    blobs = BlobStore(store_root / "blobs")
    for shard in batch:
        try:
            contents = {
                path: shard.data.get(path) or path.read_bytes() for path in shard.spools + shard.packs
            }
            _taken(store_root, shard, contents, stored)
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


def _names(directory: Path) -> set[str]:
    """What a folder holds (empty when it does not exist): one look instead of three per spool."""
    try:
        return set(os.listdir(directory))
    except FileNotFoundError:
        return set()


def _without(message: str, root: Path) -> str:
    """The reason alone: the report pairs it with the shard's path already."""
    prefix = f"{root}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


def _already_in(store_root: Path, shard: Path, run_id: str, stored: Stored) -> bool:
    """Whether the store already holds this shard's run, by the sizes its shard.json lists (a fast
    path for re-loading a sweep: shards already loaded are not read again). Spools are append-only
    and were checked when they were copied in, so equal sizes mean equal files; a spool the store
    dropped after ingest is compared by the size ingest recorded."""
    try:
        meta = msgspec.json.decode((shard / "shard.json").read_bytes(), type=_Sizes)
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
    sized: bool = True,
    progress: Callable[[int, int], None] | None = None,
    spool_mode: str | None = None,
) -> LoadReport:
    """Check and load ``(shard dir, run id)`` pairs into the store; refused shards are reported, the
    others loaded. Idempotent: loading the same shards again copies and adds nothing. Shards go in
    batches of ``BATCH_SHARDS`` (checked on ``CHECK_THREADS`` threads, copied with one flush of
    their blobs), then one ingest loads every new spool."""
    report = LoadReport()
    st = Store.open(store_dir)
    target_blobs = BlobStore(st.root / "blobs")

    def have_blob(hexd: str) -> bool:
        return target_blobs.has(hexd)

    stored = _stored_heads(st)

    def check_one(pair: tuple[Path, str]) -> Checked | ShardError | None:
        """The checked shard; None when the store holds it already; why it is refused."""
        root, run_id = pair
        try:
            if sized and _already_in(st.root, root, run_id, stored):
                return None
            return check_shard(root, run_id, sized=sized, have_blob=have_blob)
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


def store_runs(source: Path) -> list[tuple[Path, str]]:
    """Every run of another store as a (pseudo-)shard: the store's root and the run id. The runs
    share the source's ``blobs/``, so each is checked against all of them (see ``merge_store``)."""
    spool = source / "spool"
    if not spool.is_dir() or spool.is_symlink():
        raise ShardError(f"{source}: not a store (no spool/ folder)")
    return [(source, p.name) for p in sorted(spool.iterdir())]


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
    runs = store_runs(source)
    st = Store.open(store_dir)
    stored = _stored_heads(st)
    try:
        blobs_done = False
        for i, (_root, run_id) in enumerate(runs):
            try:
                checked = _check_store_run(source, run_id, with_blobs=not blobs_done)
                _copy_in(st.root, checked, report, stored)
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


def _check_store_run(source: Path, run_id: str, *, with_blobs: bool = True) -> Checked:
    """One run of another store: its spool folder, and (once) the store's whole blob folder."""
    if not ID_RE.match(run_id):
        raise ShardError(f"{source}/spool/{run_id}: not a run id")
    checked = Checked(source, run_id)
    run_dir = source / "spool" / run_id
    for rel, _st in _walk(run_dir):
        if rel.endswith(".spool") and "/" not in rel:
            if run_dir / rel not in checked.spools:
                checked.spools.append(run_dir / rel)
        elif rel.endswith(".spool" + spools.COMPRESSED) and "/" not in rel:
            plain = run_dir / rel.removesuffix(spools.COMPRESSED)
            if plain not in checked.spools:  # (a crash between compressing and removing leaves both)
                checked.spools.append(plain)
        elif rel.endswith(".spool" + spools.DROPPED) and "/" not in rel:
            raise ShardError(
                f"{run_dir}: {rel}: this store dropped the spool after ingest, so the run cannot be "
                "merged from it (its spools are needed; ingest with --spools compress or keep)"
            )
        elif not rel.endswith(".blobs"):
            raise ShardError(f"{run_dir}: {rel} is not a spool")
    for path in checked.spools:
        checked.data[path] = _check_spool(source, path, run_id)
    blobs_root = source / "blobs"
    if with_blobs and blobs_root.is_dir() and not blobs_root.is_symlink():
        store = BlobStore(blobs_root)
        for rel, _st in _walk(blobs_root):
            b = BLOB_RE.match("blobs/" + rel)
            if not b:
                continue  # a writer's temporary file
            hexd = b.group(1) + b.group(2)
            reason = store.check("sha256:" + hexd)
            if reason is not None:
                raise ShardError(f"{source}: {reason}")
            checked.blobs.append((hexd, blobs_root / rel))
        _check_packed(source, store, checked, None)
    return checked
