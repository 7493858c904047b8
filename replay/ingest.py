"""``amb ingest``: bulk-load spools into the store, verifying them on the way in.

For each spool file that changed since it was last loaded:

1. ``schemas.frames.scan`` checks every frame's checksum; a torn tail (the writer died mid-frame)
   is reported and every frame before it is kept;
2. each body's envelope is decoded (payload left raw), its hash computed, and the chain checked:
   seq starts at 0 with no gap, each ``prev_hash`` is the previous body's hash, run and source
   match the file, the kind is known and its version not newer than this amb reads;
3. the batch is loaded as one Arrow table (no row-by-row inserts) with ``INSERT OR IGNORE`` on the
   primary key ``(run_id, source, seq)``, after checking that no stored event under the same key
   has a different hash (a forked or edited spool is a conflict, not a silent ignore).

Re-ingesting is idempotent: unchanged files are skipped by size, and a changed file's events that
are already stored are ignored. A spool that grew (a live run) is loaded again from the start of the
file, which only costs reading it; a finished run gets its manifest when its ``run.finished``
event arrives.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, NamedTuple

import msgspec
import pyarrow as pa

from replay.manifest import write_manifests
from replay.store import Store
from schemas.codec import GENESIS, RawEnvelope, current_version
from schemas.errors import IngestConflict, SpoolError
from schemas.frames import Tail, scan

_decode = msgspec.json.Decoder(RawEnvelope).decode

BATCH_EVENTS = 250_000
"""Events per Arrow batch: large enough to amortise DuckDB's per-insert cost, small enough to
keep memory flat (~0.5 GB at most for typical payloads)."""


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
    runs: list[str]


_COLUMNS = ("run_id", "source", "seq", "kind", "v", "ts_ns", "payload", "prev_hash", "hash")


def spool_files(store_root: Path, run_ids: list[str] | None = None) -> list[Path]:
    spool = store_root / "spool"
    if not spool.is_dir():
        return []
    if run_ids:
        dirs = [spool / r for r in run_ids]
    else:
        dirs = sorted(p for p in spool.iterdir() if p.is_dir())
    return [f for d in dirs if d.is_dir() for f in sorted(d.glob("*.spool"))]


def read_spool(path: Path, columns: dict[str, list], key: str | None = None) -> FileReport:
    """Verify one spool and append its events to ``columns``.

    ``key`` is the path recorded in ``spool_files`` (relative to the store root)."""
    run_id = path.parent.name
    source = path.stem
    name = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpoolError(f"cannot read {name}: {e}") from e
    result = scan(data, name)
    sha256 = hashlib.sha256
    prev = GENESIS
    versions: dict[str, int] = {}
    c_seq, c_kind, c_v, c_ts = columns["seq"], columns["kind"], columns["v"], columns["ts_ns"]
    c_payload, c_prev, c_hash = columns["payload"], columns["prev_hash"], columns["hash"]
    for expected, body in enumerate(result.bodies):
        try:
            env = _decode(body)
        except msgspec.DecodeError as e:
            raise SpoolError(f"{name}: frame {expected} is not an event envelope: {e}") from e
        if env.seq != expected:
            raise SpoolError(f"{name}: expected seq {expected}, found {env.seq} (gap or reorder)")
        if env.prev_hash != prev:
            raise SpoolError(f"{name}: seq {env.seq}: broken chain (prev_hash does not match seq {env.seq - 1})")
        if env.run_id != run_id or env.source != source:
            raise SpoolError(f"{name}: seq {env.seq} belongs to {env.run_id}/{env.source}")
        top = versions.get(env.kind)
        if top is None:
            top = versions[env.kind] = current_version(env.kind)  # raises UnknownEventKind
        if env.v > top:
            raise SpoolError(f"{name}: seq {env.seq}: {env.kind} v{env.v} is newer than this amb (v{top}); upgrade amb")
        prev = "sha256:" + sha256(body).hexdigest()
        c_seq.append(env.seq)
        c_kind.append(env.kind)
        c_v.append(env.v)
        c_ts.append(env.ts_ns)
        c_payload.append(bytes(env.payload).decode())
        c_prev.append(env.prev_hash)
        c_hash.append(prev)
    n = len(result.bodies)
    columns["run_id"].extend([run_id] * n)
    columns["source"].extend([source] * n)
    columns["_file"].append((key or name, run_id, source, len(data), n, prev if n else None, result.tail))
    return FileReport(name, run_id, source, n, result.tail)


def _empty() -> dict[str, list]:
    return {c: [] for c in _COLUMNS} | {"_file": []}


def _load(store: Store, columns: dict[str, list]) -> int:
    """Insert one verified batch in one transaction; returns the number of new events."""
    con = store.con
    files = columns.pop("_file")
    table = pa.table(
        {
            "run_id": pa.array(columns["run_id"], pa.string()),
            "source": pa.array(columns["source"], pa.string()),
            "seq": pa.array(columns["seq"], pa.int64()),
            "kind": pa.array(columns["kind"], pa.string()),
            "v": pa.array(columns["v"], pa.int32()),
            "ts_ns": pa.array(columns["ts_ns"], pa.int64()),
            "payload": pa.array(columns["payload"], pa.string()),
            "prev_hash": pa.array(columns["prev_hash"], pa.string()),
            "hash": pa.array(columns["hash"], pa.string()),
        }
    )
    con.register("_amb_staging", table)
    try:
        con.execute("BEGIN TRANSACTION")
        conflict = con.execute(
            """
            SELECT s.run_id, s.source, s.seq FROM _amb_staging s
            JOIN events e USING (run_id, source, seq) WHERE e.hash <> s.hash
            ORDER BY 1, 2, 3 LIMIT 1
            """
        ).fetchone()
        if conflict:
            raise IngestConflict(
                f"run {conflict[0]} source {conflict[1]} seq {conflict[2]}: the spool differs from the "
                "event already stored under that key (forked or edited spool); nothing was loaded"
            )
        before = con.execute("SELECT count(*) FROM events").fetchone()[0]
        con.execute("INSERT OR IGNORE INTO events SELECT * FROM _amb_staging")
        added = con.execute("SELECT count(*) FROM events").fetchone()[0] - before
        for path, run_id, source, size, frames, last_hash, tail in files:
            con.execute(
                "INSERT OR REPLACE INTO spool_files VALUES (?, ?, ?, ?, ?, ?, ?, now())",
                [path, run_id, source, size, frames, last_hash, tail.length if tail else 0],
            )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        con.unregister("_amb_staging")
    return added


def ingest(
    store_dir: str | os.PathLike[str] | None = None,
    run_ids: list[str] | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    store: Store | None = None,
) -> IngestReport:
    """Load every changed spool (of ``run_ids``, or all) into the store."""
    own = store is None
    st = store or Store.open(store_dir)
    try:
        paths = spool_files(st.root, run_ids)
        known = {
            row[0]: row[1] for row in st.con.execute("SELECT path, size FROM spool_files").fetchall()
        }
        columns = _empty()
        pending = 0
        loaded = events_read = added = 0
        torn: list[FileReport] = []
        runs: set[str] = set()
        for i, path in enumerate(paths):
            if progress:
                progress(i, len(paths))
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            key = path.relative_to(st.root).as_posix()
            if known.get(key) == size:
                continue
            report = read_spool(path, columns, key)
            loaded += 1
            events_read += report.frames
            pending += report.frames
            runs.add(report.run_id)
            if report.tail is not None:
                torn.append(report)
            if pending >= BATCH_EVENTS:
                added += _load(st, columns)
                columns, pending = _empty(), 0
        if columns["_file"]:
            added += _load(st, columns)
        if progress:
            progress(len(paths), len(paths))
        write_manifests(st, sorted(runs))
        return IngestReport(len(paths), loaded, events_read, added, torn, sorted(runs))
    finally:
        if own:
            st.close()
