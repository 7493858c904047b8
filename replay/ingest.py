"""``amb ingest``: bulk-load spools into the store, verifying them on the way in.

Every changed spool is checked frame by frame in Python (length, checksum: ``replay.ingest_frames``)
and loaded in one streaming ``INSERT ... SELECT`` per batch that checks each body against the
columns stored (``replay.ingest_sql``); then each (run, source)'s seqs and chain are checked in the
same transaction. A failed batch is rolled back and loaded again file by file, so one bad spool
does not keep the others out. ``docs/storage.md`` says how and why in full.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import duckdb
import pyarrow as pa
import zstandard

from replay import ingest_frames, ingest_sql, spools
from replay.bounded import DatabaseMemory
from replay.ingest_frames import FramesAhead
from replay.manifest import write_manifests
from replay.store import Store, first
from replay.transaction import transaction
from schemas.blobpack import materialise, packs_in
from schemas.codec import ID_RE, current_version, decode_body
from schemas.errors import AmbError, IngestConflict, SchemaError, SpoolError
from schemas.frames import MAGIC, Tail, scan, tail_of
from schemas.tempdirs import tempdir

BATCH_FILES = 3000
"""Spool files per DuckDB statement (about a million events for typical runs). Not fewer: a batch of
less than a row group (122,880 events) is not written to the file as it is inserted, and its commit
costs as much again."""

INGEST_MEMORY = 192 << 20
"""The database's memory limit while spools are loaded (left alone, DuckDB keeps every block it
wrote and read until it runs short). Above the limit a batch spills to the database's temporary
directory; one that cannot is loaded again with twice the limit (``bounded.DatabaseMemory``)."""


class FileReport(NamedTuple):
    path: str
    run_id: str
    source: str
    frames: int
    tail: Tail | None


class IngestReport(NamedTuple):
    files_seen: int
    files_loaded: int
    events_read: int
    events_added: int
    torn: list[FileReport]
    """Spools and blob packs with a torn tail (``frames`` counts what was kept before it)."""
    runs: list[str]
    blobs_materialised: int = 0
    """Blobs moved from packs left by recorders that died before closing (``schemas.blobpack``)."""
    failed: list[tuple[str, str]] = []
    """Spools that could not be loaded: (path in the store, why). Nothing of them was stored."""
    settled: dict[str, int] = {}
    """Spools of finished runs compressed or dropped after this ingest (``replay.spools``)."""


class _Spool(NamedTuple):
    key: str
    """Path relative to the store root, as recorded in ``spool_files``."""
    readable: str
    """What DuckDB reads: the spool itself, or a temporary copy of its complete frames."""
    run_id: str
    source: str
    size: int
    tail: Tail | None
    in_place: bool = False
    """``readable`` is the producer's own file (``size`` bytes when ``_prepare`` looked), not a copy."""
    mtime_ns: int = 0
    """When ``_prepare`` looked, the modification time of a spool read in place."""


def spool_files(store_root: Path, run_ids: list[str] | None = None) -> list[Path]:
    """Every spool: plain ``<source>.spool``, or its compressed ``.spool.zst`` when only that is left."""
    spool = store_root / "spool"
    if not spool.is_dir():
        return []
    if run_ids:
        dirs = [spool / r for r in run_ids]
    else:
        with os.scandir(spool) as entries:
            dirs = sorted(Path(e.path) for e in entries if e.is_dir())
    out = []
    for d in dirs:
        try:
            names = [n for n in os.listdir(d) if not n.startswith(".")]
        except (FileNotFoundError, NotADirectoryError):
            continue
        plain = {n for n in names if n.endswith(".spool")}
        packed = {n for n in names if n.endswith(".spool" + spools.COMPRESSED)}
        packed = {z for z in packed if z.removesuffix(spools.COMPRESSED) not in plain}
        out += [d / n for n in sorted(plain | packed)]
    return out


def _own_file(path: Path) -> None:
    """``SpoolError`` unless ``path`` is a regular file in a real folder of the store: a spool or
    run folder that is a link would have ingest read, compress and remove files outside the store,
    and a FIFO would keep it waiting for a writer forever."""
    for what, where in (("its run folder", path.parent), ("it", path)):
        mode = os.lstat(where).st_mode
        if stat.S_ISLNK(mode):
            raise SpoolError(f"{path}: {what} is a symbolic link (a store's spools are its own files)")
    if not stat.S_ISREG(mode):
        raise SpoolError(f"{path}: not a regular file")


def spool_key(store_root: Path, path: Path) -> str:
    """The spool's name in ``spool_files``: its plain path, also for a compressed one."""
    key = path.relative_to(store_root).as_posix()
    return key.removesuffix(spools.COMPRESSED)


def _prepare(path: Path, key: str, tmp: Path, *, copy: bool = False) -> _Spool | None:
    """Check a spool's header and end; copy the complete frames aside if the tail is torn (or the
    spool is compressed, or ``copy``)."""
    run_id, source = path.parent.name, Path(key).stem
    if not (ID_RE.match(run_id) and ID_RE.match(source)):
        raise SpoolError(f"{path}: not a spool of the store layout spool/<run>/<source>.spool")
    _own_file(path)
    compressed = path.name.endswith(spools.COMPRESSED)
    if compressed:
        try:
            plain = tmp / f"{len(os.listdir(tmp))}.spool"
            plain.write_bytes(spools.read_bytes(path))
        except zstandard.ZstdError as e:
            raise SpoolError(f"{key}{spools.COMPRESSED}: cannot decompress ({e})") from e
        path = plain
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
        info = os.fstat(f.fileno())
        size = info.st_size
        f.seek(max(size - 1, 0))
        last = f.read(1)
        if head != MAGIC:
            if MAGIC.startswith(head):
                return _Spool(
                    key, "", run_id, source, size, Tail(0, size, "incomplete file header") if size else None
                )
            raise SpoolError(f"{path}: not a spool file (bad magic)")
        if last == b"\n" and not copy:
            return _Spool(
                key, str(path), run_id, source, size, None, in_place=not compressed, mtime_ns=info.st_mtime_ns
            )
        f.seek(0)
        data = f.read(size)
    tail = tail_of(data)
    copied = tmp / f"{len(os.listdir(tmp))}.spool"
    copied.write_bytes(data[: tail.offset] if tail else data)
    return _Spool(key, str(copied), run_id, source, size, tail)


def _materialise_packs(store: Store, run_dirs: set[Path]) -> tuple[int, list[FileReport]]:
    """Move the blob packs of these runs into the blob store, before their events become visible.

    A pack is normally materialised and removed by its producer when it closes; one still here
    belongs to a producer that died (or is still running: its complete records are copied, the
    pack is left to it)."""
    created, torn = 0, []
    for run_dir in sorted(run_dirs):
        for pack in packs_in(run_dir):
            try:
                done = materialise(pack, store.blobs)
            except FileNotFoundError:
                continue  # its producer closed and removed it just now
            created += done.created
            if done.torn_at is not None:
                key = pack.relative_to(store.root).as_posix()
                torn.append(
                    FileReport(
                        key,
                        run_dir.name,
                        pack.stem,
                        done.records,
                        Tail(done.torn_at, done.torn_bytes, "incomplete blob record"),
                    )
                )
    return created, torn


def _explain(files: list[_Spool], error: duckdb.Error) -> AmbError:
    """Turn a failed bulk statement into one precise error, re-reading the batch in Python."""
    text = str(error)
    marker = "Invalid Input Error: "
    message = text.split(marker, 1)[1].splitlines()[0] if marker in text else None
    if message:
        if message.startswith("CONFLICT "):
            return IngestConflict(message[len("CONFLICT ") :] + "; nothing was loaded")
        for tag in ("UNKNOWN ", "NEWER "):
            if tag in message:
                return SchemaError(message.replace(tag, ""))
        if message.startswith("spool "):
            return SpoolError(message)
    # A frame DuckDB could not even split or parse: find it with the reference reader.
    for spool in files:
        if not spool.readable:
            continue
        data = Path(spool.readable).read_bytes()
        for body in scan(data, spool.key).bodies:
            try:
                env = decode_body(body)
                current_version(env.kind)
            except AmbError as e:
                return SpoolError(f"spool {spool.key}: {e}")
    return SpoolError(f"cannot load spools: {text.splitlines()[0]}")


def _first_failure(failures: list[tuple[str, AmbError]], report: IngestReport) -> AmbError:
    """The first failure (its own type and message, naming the other bad spools), with the report."""
    first_error = failures[0][1]
    if len(failures) > 1:
        others = ", ".join(key for key, _ in failures[1:4]) + (", ..." if len(failures) > 4 else "")
        first_error = type(first_error)(f"{first_error} (and {len(failures) - 1} more bad spools: {others})")
    first_error.report = report  # type: ignore[attr-defined]  # read by `amb ingest` to say what loaded
    return first_error


def _insert(con: duckdb.DuckDBPyConnection, sql: str, parts: list[str], readable: list[_Spool]) -> int:
    """The bulk statement over the batch's frames files (``ingest_frames.check_batch``). Each row
    names its spool by its index in the batch; the spools' keys, runs and sources are list
    parameters indexed by it (a join on the file name would carry every body through it)."""
    params = {
        "batch": parts,
        "keys": [f.key for f in readable],
        "runs": [f.run_id for f in readable],
        "sources": [f.source for f in readable],
    }
    return int(con.execute(sql, params).fetchall()[0][0])


def _pairs(spools: list[_Spool]) -> list[tuple[str, str]]:
    """The (key, path to read) of the spools DuckDB reads (``ingest_frames.check_batch``)."""
    return [(f.key, f.readable) for f in spools if f.readable]


class _Changed(Exception):
    """Spools read in place changed while the statement read them (their producer appends)."""


def _check_unchanged(readable: list[_Spool]) -> None:
    """``_Changed`` naming the spools read in place that are no longer as ``_prepare`` saw them."""
    changed = []
    for spool in readable:
        if spool.in_place:
            try:
                st = os.stat(spool.readable)
                if (st.st_size, st.st_mtime_ns) != (spool.size, spool.mtime_ns):
                    changed.append(spool.key)
            except FileNotFoundError:
                changed.append(spool.key)
    if changed:
        raise _Changed(", ".join(changed))


def _load(store: Store, files: list[_Spool], blob_marks: dict[str, int], frames: FramesAhead) -> int:
    """Load these spools in one transaction (their frames files written by ``frames``). If one read in
    place changed meanwhile (a producer still appending), the batch is loaded again from copies of
    the spools it read in place, which nothing can change under it."""
    try:
        return _load_once(store, files, blob_marks, frames)
    except _Changed:
        with tempdir("amb-ingest-copies-") as aside:
            copies = []
            for f in files:
                try:
                    copy = _prepare(Path(f.readable), f.key, aside, copy=True) if f.in_place else f
                except FileNotFoundError as e:
                    raise SpoolError(f"{f.key}: removed while it was being ingested") from e
                if copy is not None:
                    copies.append(copy)
            return _load_once(store, copies, blob_marks, FramesAhead(aside, None))


def _load_once(store: Store, files: list[_Spool], blob_marks: dict[str, int], frames: FramesAhead) -> int:
    """One transaction: the bulk insert of the readable spools, the checks of what it stored, and
    the record of every spool in ``spool_files``. Returns how many events were added."""
    con = store.con
    readable = [f for f in files if f.readable]
    con.register("_amb_files_arrow", _files_table(readable))
    # Row order in the table carries no meaning (seq does), so let DuckDB load in parallel freely.
    con.execute("SET preserve_insertion_order = false")
    try:
        with transaction(con):
            con.execute("CREATE OR REPLACE TEMP TABLE _amb_files AS SELECT * FROM _amb_files_arrow")
            added = 0
            if readable:
                added = _insert_checked(con, readable, blob_marks, frames)
                _check_sequences(con)
            _record_files(con, files)
        return added
    finally:
        con.unregister("_amb_files_arrow")


def _files_table(readable: list[_Spool]) -> pa.Table:
    return pa.table(
        {
            "idx": pa.array(range(len(readable)), pa.int64()),
            "key": [f.key for f in readable],
            "readable": [f.readable for f in readable],
            "run_id": [f.run_id for f in readable],
            "source": [f.source for f in readable],
        }
    )


def _insert_checked(
    con: duckdb.DuckDBPyConnection, readable: list[_Spool], blob_marks: dict[str, int], ahead: FramesAhead
) -> int:
    """The frames checked (length and checksum first) and copied to the batch's frames files, blob
    references counted, then the bulk insert of those files; ``_Changed`` if a spool read in place
    changed meanwhile, else the precise error of a failed check."""
    frames = ingest_frames.Frames({}, None, [])
    try:
        frames = ahead.frames(_pairs(readable))
        if frames.problem:
            _check_unchanged(readable)
            raise frames.problem
        seen = first(
            con.execute("SELECT 1 FROM events WHERE run_id IN (SELECT run_id FROM _amb_files) LIMIT 1")
        )
        try:
            with ahead.sharing(con):  # (the checks after it run on every thread)
                added = _insert(con, ingest_sql.insert_sql(bool(seen)), frames.parts, readable)
        except duckdb.OutOfMemoryException:
            raise  # not the spools' fault: the batch is loaded again with more memory (``_Batches``)
        except duckdb.Error as e:
            _check_unchanged(readable)
            raise _explain(readable, e) from e
    finally:
        for part in frames.parts:
            Path(part).unlink(missing_ok=True)
    _check_unchanged(readable)  # what was loaded (and counted) of them may not be what _prepare saw
    blob_marks.update(frames.marks)
    return added


def _check_sequences(con: duckdb.DuckDBPyConnection) -> None:
    """Per (run, source) of the batch: seqs 0, 1, 2, ... with no gap or duplicate, and every
    ``prev_hash`` the hash of the event before it."""
    bad = first(con.execute(ingest_sql.SEQUENCE_CHECK))
    if bad:
        run_id, source, n, distinct, lo, hi = bad
        what = (
            "duplicate seq"
            if n != distinct
            else f"seq starts at {lo}"
            if lo
            else f"sequence gap ({n} events, last seq {hi})"
        )
        raise SpoolError(f"spool {run_id}/{source}: {what}")
    bad = first(con.execute(ingest_sql.CHAIN_CHECK))
    if bad:
        raise SpoolError(
            f"spool {bad[0]}/{bad[1]}: seq {bad[2]}: broken chain (prev_hash is not the hash "
            f"of seq {bad[2] - 1})"
        )


def _record_files(con: duckdb.DuckDBPyConnection, files: list[_Spool]) -> None:
    """Each spool's size, frames, last hash and torn bytes in ``spool_files`` (the next ingest
    skips a spool of the same size)."""
    con.register(
        "_amb_all_files",
        pa.table(
            {
                "key": [f.key for f in files],
                "run_id": [f.run_id for f in files],
                "source": [f.source for f in files],
                "size": pa.array([f.size for f in files], pa.int64()),
                "torn": pa.array([f.tail.length if f.tail else 0 for f in files], pa.int64()),
            }
        ),
    )
    con.execute(ingest_sql.RECORD_FILES)
    con.unregister("_amb_all_files")


def _runs_not_stored(store: Store, run_ids: set[str]) -> set[str]:
    """Those of ``run_ids`` of which the store holds no event."""
    if not run_ids:
        return set()
    stored = store.con.execute(
        "SELECT DISTINCT run_id FROM events WHERE run_id IN (SELECT unnest($runs))", {"runs": sorted(run_ids)}
    ).fetchall()
    return run_ids - {r for (r,) in stored}


def ingest(
    store_dir: str | os.PathLike[str] | None = None,
    run_ids: list[str] | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    store: Store | None = None,
    spool_mode: str | None = None,
) -> IngestReport:
    """Load every changed spool (of ``run_ids``, or all) into the store, then compress or drop the
    spools of finished runs as ``spool_mode`` (else $AMB_SPOOLS, else compress) says (``replay.spools``)."""
    how = spools.mode(spool_mode)
    own = store is None
    st = store or Store.open(store_dir)
    try:
        paths = spool_files(st.root, run_ids)
        with DatabaseMemory(st.con, INGEST_MEMORY) as memory:
            batches = _Batches(st, memory)
            with tempdir("amb-ingest-") as tmp:
                batches.load_changed(paths, tmp, progress)
            if progress:
                progress(len(paths), len(paths))
            report = batches.report(len(paths))
            if own:  # (under the limit: left to the close, it holds as much again as the load)
                memory.checkpoint()
        if batches.failures:
            raise _first_failure(batches.failures, report)
        return report._replace(settled=spools.settle(st, how))
    finally:
        if own:
            st.close()


class _Batches:
    """The spools of one ingest, loaded in batches of ``BATCH_FILES``: what was loaded, what failed,
    and what the report and the manifests need of them."""

    def __init__(self, st: Store, memory: DatabaseMemory):
        self.st, self.memory = st, memory
        self.known = dict(st.con.execute("SELECT path, size FROM spool_files").fetchall())
        """Each spool loaded before, by key: the size it had."""
        self.loaded: list[_Spool] = []
        self.added = self.materialised = 0
        self.with_packs: set[Path] = set()
        """The run folders of the spools being loaded that hold blob packs (``load_changed``)."""
        self.torn_packs: list[FileReport] = []
        self.failures: list[tuple[str, AmbError]] = []
        self.blob_marks: dict[str, int] = {}
        self.new_runs: set[str] = set()
        self.frames = FramesAhead(Path(), None)
        """Where each batch's frames are written for the statement (``load_changed``)."""

    def load_changed(self, paths: list[Path], tmp: Path, progress: Callable[[int, int], None] | None) -> None:
        """Every spool of ``paths`` that changed since it was loaded, prepared (in ``tmp`` where it
        must be copied) and loaded batch by batch, the next batch's frames written by a thread
        while the database loads one (``FramesAhead``)."""
        st = self.st
        self.new_runs = _runs_not_stored(st, {p.parent.name for p in paths})
        batches = self._prepared(paths, tmp, progress)
        # The run folders with blob packs, listed before the pass starts (beside its thread, a
        # listing per batch waited on it for the interpreter): a pack holds a blob before a frame
        # refers to it, and the frames loaded are those the batches were prepared with.
        folders = {(st.root / f.key).parent for b in batches for f in b}
        self.with_packs = {d for d in folders if any(packs_in(d))}
        with ThreadPoolExecutor(1) as pool:
            self.frames = FramesAhead(tmp, pool)
            for i, batch in enumerate(batches):  # (the thread writes them in turn: this one's first)
                for ahead in batches[: i + 2] if i == 0 else batches[i + 1 : i + 2]:
                    self.frames.start(_pairs(ahead))
                self.loaded += self._load(batch)

    def _prepared(
        self, paths: list[Path], tmp: Path, progress: Callable[[int, int], None] | None
    ) -> list[list[_Spool]]:
        """The spools of ``paths`` that changed since they were loaded, prepared, in batches."""
        st = self.st
        batches: list[list[_Spool]] = [[]]
        for i, path in enumerate(paths):
            if progress and i % 100 == 0:
                progress(i, len(paths))
            key = spool_key(st.root, path)
            try:
                if key in self.known and (
                    key != path.relative_to(st.root).as_posix() or self.known[key] == path.stat().st_size
                ):
                    continue  # unchanged since loaded (a compressed spool is made only after that)
                spool = _prepare(path, key, tmp)
            except FileNotFoundError:
                continue
            except AmbError as e:
                self.failures.append((key, e))
                continue
            if spool is None:
                continue
            if len(batches[-1]) >= BATCH_FILES:
                batches.append([])
            batches[-1].append(spool)
        return [b for b in batches if b]

    def _load(self, batch: list[_Spool]) -> list[_Spool]:
        """The batch's blob packs, then its spools in one transaction; if that fails, each spool on
        its own, keeping the good ones. Returns those loaded."""
        st = self.st
        try:
            folders = {(st.root / s.key).parent for s in batch} & self.with_packs
            created, torn = _materialise_packs(st, folders)
        except AmbError as e:
            self.failures.append((batch[0].key, e))
            return []
        self.materialised += created
        self.torn_packs.extend(torn)
        try:
            self.added += self._load_spools(batch)
            return batch
        except AmbError as e:
            if len(batch) == 1:
                self.failures.append((batch[0].key, e))
                return []
        good = []
        for spool in batch:  # rolled back: find the bad ones, keep the rest
            try:
                self.added += self._load_spools([spool])
                good.append(spool)
            except AmbError as e:
                self.failures.append((spool.key, e))
        return good

    def _load_spools(self, files: list[_Spool]) -> int:
        """``_load``, again with twice the memory limit each time the database runs short."""
        return self.memory.retrying(lambda: _load(self.st, files, self.blob_marks, self.frames))

    def report(self, seen: int) -> IngestReport:
        """What was loaded, with the manifests of its runs written first (``replay.manifest``)."""
        st, loaded = self.st, self.loaded
        runs = sorted({s.run_id for s in loaded})
        frames = {
            (r, s): n
            for r, s, n in st.con.execute("SELECT run_id, source, frames FROM spool_files").fetchall()
        }
        torn = [
            FileReport(s.key, s.run_id, s.source, frames.get((s.run_id, s.source), 0), s.tail)
            for s in loaded
            if s.tail
        ]
        blob_refs: dict[str, int] = {}
        for spool in loaded:  # a run new to the store holds exactly what this ingest loaded of it
            if spool.run_id in self.new_runs:
                blob_refs[spool.run_id] = blob_refs.get(spool.run_id, 0) + self.blob_marks.get(spool.key, 0)
        write_manifests(st, runs, blob_refs)
        read = sum(frames.get((s.run_id, s.source), 0) for s in loaded)
        failed = [(key, str(e)) for key, e in self.failures]
        return IngestReport(
            seen, len(loaded), read, self.added, torn + self.torn_packs, runs, self.materialised, failed
        )
