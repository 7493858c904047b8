"""``amb verify``: re-derive every hash in the store and check every chain, manifest and blob.

The checks are vectorised: the canonical body of each event is rebuilt from its stored columns
(the contract in ``schemas.codec`` makes that a string concatenation) and hashed, and compared with
the stored hash; each (run, source)'s seqs must run 0, 1, 2, ... with every ``prev_hash`` the
previous event's hash. Then each finished run's stored manifest is compared with the store's
current state, and every referenced blob is read back and re-hashed (packs streamed front to back:
``replay.blob_pass``).

What each tamper looks like: an edited payload byte or envelope field → hash mismatch at that
event; a deleted event → a seq gap (or, for the last event of a source, a manifest mismatch);
reordered events → hash mismatch (seq is inside the hash) or a broken link; a spool that ingest
refused, or a chain's last events deleted → fewer events than the run's ``run.finished`` counts say
the recorder wrote; the recorder's own spool refused (or its events deleted) → a run whose proxy or
shim events have no ``run.started`` from the recorder (``replay.run_counts``); a chain rebuilt by
someone who can write the file → only an anchored manifest (``--manifest``) catches it.

How the work is laid out (a million events: docs/storage.md). The payloads are read once: one
query per batch of row ids yields each event's canonical body and stored hash, the hot columns'
first difference from the payload, and the blob references and their count; DuckDB builds a batch
while this thread hashes the one before. One grouped query (no payloads) gives each chain's count,
first and last seq and last hash, which say both whether the chain is sound and what its manifest
is; an anti-join finds the broken links. The blob pass starts before all of it (it needs the
references only at the end).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, NamedTuple

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay import blob_pass, hot
from replay import manifest as manifests
from replay.bounded import DatabaseMemory, References, drop_cache
from replay.run_counts import short_sources, unstarted
from schemas.blob import HASH_PREFIX
from schemas.blobstore import BlobStore
from schemas.blobverify import verify_many
from schemas.codec import GENESIS

BODY_SQL = (
    """concat('{"kind":"', kind, '","payload":', CAST(payload AS VARCHAR), ',"prev_hash":"', prev_hash,"""
    """ '","run_id":"', run_id, '","seq":', seq, ',"source":"', source, '","ts_ns":', ts_ns,"""
    """ ',"v":', v, '}')"""
)
"""The canonical body rebuilt from the stored columns (see schemas.codec)."""

ChainStat = tuple[str, str, int, int, int, str, bool, bool]
"""(run, source, count, min seq, max seq, hash at the max seq, seq 0 not on ``GENESIS``, holds a
``run.started``) of one chain (``_chain_stats``)."""

HASH_MISMATCH = "hash mismatch: the event was edited after it was recorded"
BROKEN_LINK = "broken chain: prev_hash is not the hash of the event before it"


class Problem(NamedTuple):
    run_id: str
    source: str | None
    seq: int | None
    kind: str | None
    what: str

    def __str__(self) -> str:
        where = f"run {self.run_id}"
        if self.source is not None:
            where += f" source {self.source}"
        if self.seq is not None:
            where += f" seq {self.seq}"
        if self.kind:
            where += f" ({self.kind})"
        return f"{where}: {self.what}"


def _run_filter(run_ids: list[str] | None) -> tuple[str, list[Any]]:
    if not run_ids:
        return "", []
    return f"WHERE run_id IN ({', '.join('?' for _ in run_ids)})", list(run_ids)


STORED_HEX = (
    f"CASE WHEN starts_with(hash, '{HASH_PREFIX}') THEN substr(hash, {len(HASH_PREFIX) + 1})"
    " ELSE '!' || hash END"
)

ROW_GROUP = 122_880
"""DuckDB's rows per row group: a query's scan runs one thread per row group."""

HASH_BATCH = ROW_GROUP // 2
"""Events per chunk of the scan (whole runs: a bigger run is a chunk of its own). A chunk is built
by the database while the one before is hashed here, so two chunks are in memory whatever the size
of the store. Each chunk's queries decompress the row groups its row ids reach: smaller chunks
decompress every payload several times, bigger ones hold more memory."""


def _string_slices(array: pa.Array) -> tuple[memoryview, list[int]]:
    """A string array's bytes and its offsets (value i is ``data[offsets[i]:offsets[i + 1]]``),
    read from Arrow's buffers without making a Python object per value or copying the bytes."""
    if array.type not in (pa.string(), pa.large_string()):
        array = array.cast(pa.large_string())
    offset_type = np.int32 if array.type == pa.string() else np.int64
    _, offsets, data = array.buffers()
    if data is None:  # every value empty
        return memoryview(b""), [0] * (len(array) + 1)
    starts = np.frombuffer(offsets, dtype=offset_type)[array.offset : array.offset + len(array) + 1]
    return memoryview(data), starts.tolist()


def _rehash_failures(batch: pa.Table) -> list[int]:
    """Positions in the batch of the events whose stored hash is not the sha256 of their body.

    Hashed here rather than with DuckDB's ``sha256``: hashlib's (OpenSSL's) takes a fraction of
    its time per byte, and this loop runs on its own core while DuckDB builds the next batch.
    ``hex`` is the stored hash without its prefix (a hash without the prefix gets a ``!``, which
    no hex digest equals), so a sound batch is one comparison of two lists."""
    stored = batch.column("hex").to_pylist()
    sha256 = hashlib.sha256
    digests: list[str] = []
    for chunk in batch.column("body").chunks:  # chunk by chunk: combining them copied every body
        data, offsets = _string_slices(chunk)
        digests += [sha256(data[a:b]).hexdigest() for a, b in zip(offsets, offsets[1:], strict=False)]
    if digests == stored:
        return []
    return [i for i, (got, want) in enumerate(zip(digests, stored, strict=True)) if got != want]


def _chain_problems(
    con: duckdb.DuckDBPyConnection, chains: list[tuple[str, str]], cond: str, params: list[Any]
) -> dict[tuple[str, str, int], tuple[str, str]]:
    """Gaps and broken links in these (unsound) chains, by event: (kind, what). A gap says more
    than a broken link. The window that words them runs over these chains only (of the events that
    ``cond`` keeps). Two events that claim one seq are ordered by their hashes, so that the same
    store is always worded the same way (by seq alone, which of them came first followed the rows'
    order on disk)."""
    if not chains:
        return {}
    con.register(
        "_amb_unsound", pa.table({"run_id": [c[0] for c in chains], "source": [c[1] for c in chains]})
    )
    try:
        rows = con.execute(
            f"""
            WITH e AS (
                SELECT run_id, source, seq, kind, prev_hash,
                       lag(hash) OVER w AS prev_stored,
                       row_number() OVER w - 1 AS expected_seq
                FROM (SELECT run_id, source, seq, kind, hash, prev_hash FROM events
                      SEMI JOIN _amb_unsound USING (run_id, source) WHERE {cond}) AS events
                WINDOW w AS (PARTITION BY run_id, source ORDER BY seq, hash)
            )
            SELECT run_id, source, seq, kind,
                   CASE WHEN seq <> expected_seq THEN 'sequence gap: seq ' || expected_seq || ' is missing'
                   END AS gap
            FROM e
            WHERE seq <> expected_seq OR prev_hash <> coalesce(prev_stored, '{GENESIS}')
            """,
            params,
        ).fetchall()
    finally:
        con.unregister("_amb_unsound")
    return {(r[0], r[1], r[2]): (r[3], r[4] or BROKEN_LINK) for r in rows}


def _scan_sql(cond: str, columns: list[hot.HotColumn]) -> str:
    """The one query over a chunk of events (those ``cond`` keeps) that reads the payloads.

    Per event: the canonical body and stored hash (``hex``); ``hot``, the name of the first of the
    hot ``columns`` (those the store has) that differs from the payload, else NULL; and for a
    payload that holds a blob reference, the references (``refs``) and the number of reference
    marks (``marks``, what a manifest counts). The hot columns' fields are extracted with one JSON
    parse per event into a list; ``list_position`` over the comparisons reads that list without
    a CASE, whose branches DuckDB would each parse again."""
    if columns:
        paths = ", ".join(f"'$.{c.path}'" for c in columns)
        extract = f", json_extract_string(payload, [{paths}]) AS hx"
        diffs = ", ".join(
            f"{c.name} IS DISTINCT FROM {hot.cast(f'hx[{i + 1}]', c)}" for i, c in enumerate(columns)
        )
        names = ", ".join(f"'{c.name}'" for c in columns)
        hot_sql = f"[{names}][list_position([{diffs}], true)]"
    else:  # a store from before the hot columns
        extract, hot_sql = "", "NULL::VARCHAR"
    mark = manifests.BLOB_MARK
    return f"""
        SELECT {BODY_SQL} AS body, {STORED_HEX} AS hex, run_id, source, seq, kind,
               {hot_sql} AS hot,
               CASE WHEN has_ref THEN {manifests.BLOB_REF_SQL} END AS refs,
               CASE WHEN has_ref THEN (strlen(payload) - strlen(replace(payload, '{mark}', '')))
                                      // {len(mark)} END AS marks
        FROM (SELECT *, {manifests.HAS_BLOB_SQL} AS has_ref{extract} FROM events WHERE {cond})
        """


class _Chunk(NamedTuple):
    """Whole runs, consecutive in the table, scanned together: their ids and the row ids they span."""

    runs: list[str]
    lo: int
    hi: int


def _chunks(con: duckdb.DuckDBPyConnection, where: str, params: list[Any], batch: int) -> list[_Chunk]:
    """The runs (those ``where`` keeps) in chunks of about ``batch`` events, in the order of their
    rows: a run is never split (its chains are checked whole), so the largest run sets the size of
    the largest chunk, whatever the number of runs. Row ids can be sparse (deleted rows, or rows
    inserted by the caller's open transaction, numbered from 2^62): a chunk's range may hold other
    runs' rows too, which its run list leaves out."""
    rows = con.execute(
        f"SELECT run_id, min(rowid), max(rowid), count(*) FROM events {where} GROUP BY run_id ORDER BY 2, 1",
        params,
    ).fetchall()
    chunks: list[_Chunk] = []
    held = 0
    for run_id, lo, hi, count in rows:
        if chunks and held + count <= batch:
            last = chunks[-1]
            chunks[-1] = _Chunk([*last.runs, run_id], min(last.lo, lo), max(last.hi, hi))
            held += count
        else:
            chunks.append(_Chunk([run_id], lo, hi))
            held = count
    return chunks


def _chunk_filter(where: str, params: list[Any], chunk: _Chunk) -> tuple[str, list[Any]]:
    """The condition that keeps a chunk's events (the row id range first: it prunes the scan)."""
    cond = "rowid >= ? AND rowid <= ? AND run_id IN (SELECT unnest(?::VARCHAR[]))"
    extra = f" AND {where.removeprefix('WHERE ')}" if where else ""
    return cond + extra, [chunk.lo, chunk.hi, chunk.runs, *params]


class _Fetched(NamedTuple):
    """The database's work on one chunk: the scan of its events, its chains' statistics and the
    gaps and broken links of those that are not sound, and its runs' stored manifests."""

    table: pa.Table
    stats: list[ChainStat]
    chain_problems: dict[tuple[str, str, int], tuple[str, str]]
    stored: list[tuple[str, str]]
    finished: list[tuple[str, str | None]]
    """(run, its run.finished's ``counts`` as JSON text) of each run.finished the recorder wrote."""


def _fetch(
    con: duckdb.DuckDBPyConnection, sql: str, cond: str, params: list[Any], runs: list[str]
) -> _Fetched:
    table = con.sql(sql, params=params).to_arrow_table()
    stats = _chain_stats(con, cond, params)
    unsound = _unsound(stats, _broken_links(con, cond, params))
    stored = con.execute(
        "SELECT run_id, manifest FROM manifests WHERE run_id IN (SELECT unnest(?::VARCHAR[])) "
        "ORDER BY run_id",
        [runs],
    ).fetchall()
    # The recorder's own ends only: an imported run's run.finished (source ``import``) may carry the
    # counts of the run it was recorded as, whose sources it does not have.
    finished = con.execute(
        f"SELECT run_id, CAST(payload->'$.counts' AS VARCHAR) FROM events "
        f"WHERE {cond} AND kind = 'run.finished' AND source = 'recorder'",
        params,
    ).fetchall()
    return _Fetched(
        table,
        stats,
        _chain_problems(con, unsound, cond, params),
        [tuple(r) for r in stored],
        [tuple(r) for r in finished],
    )


class _Part(NamedTuple):
    """What the scan found in one chunk of runs: one problem per event (by key), the runs' manifests
    as the store holds them now and their stored ones, and the blobs the chunk refers to."""

    problems: dict[tuple[str, str, int], Problem]
    current: dict[str, dict[str, Any]]
    stored: list[tuple[str, str]]
    addresses: list[str]
    missing: list[Problem]
    """What the recorder's own events say is missing: runs it did not start in the store (no
    ``run.started`` of its own), sources holding fewer events than its ``run.finished`` counts."""


def _chain_stats(con: duckdb.DuckDBPyConnection, cond: str, params: list[Any]) -> list[ChainStat]:
    """Each chain's ``ChainStat``: the manifests' counts, half of the chain check, and whether it
    holds a ``run.started`` (no payload read, nothing sorted)."""
    rows = con.execute(
        f"""
        SELECT run_id, source, count(*), min(seq), max(seq), arg_max(hash, seq),
               bool_or(seq = 0 AND prev_hash <> '{GENESIS}'), bool_or(kind = 'run.started')
        FROM events WHERE {cond} GROUP BY ALL ORDER BY 1, 2
        """,
        params,
    ).fetchall()
    return [tuple(r) for r in rows]


def _broken_links(con: duckdb.DuckDBPyConnection, cond: str, params: list[Any]) -> list[tuple[str, str]]:
    """The chains with an event at seq > 0 whose ``prev_hash`` is not the hash of an event at seq - 1
    of the same chain (an anti-join: no sort), among the events ``cond`` keeps."""
    rows = con.execute(
        f"""
        SELECT DISTINCT e.run_id, e.source
        FROM (SELECT run_id, source, seq, prev_hash FROM events WHERE {cond} AND seq > 0) AS e
        ANTI JOIN (SELECT run_id, source, seq, hash FROM events WHERE {cond}) AS p
          ON p.run_id = e.run_id AND p.source = e.source AND p.seq = e.seq - 1 AND p.hash = e.prev_hash
        """,
        params + params,
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def _unsound(stats: list[ChainStat], broken: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The chains that are not sound. A chain is sound exactly when its count is its max seq + 1,
    its min seq is 0, its seq 0 is on ``GENESIS`` and no link is broken: with every seq above 0
    linked to an event at seq - 1, all of 0..max are there, and n events over max + 1 values
    leave no seq twice."""
    bad = {(r, s) for r, s, n, lo, hi, _, off, _ in stats if n != hi + 1 or lo != 0 or off}
    return sorted(bad | set(broken))


def _marks_by_run(found: pa.Table) -> dict[str, int]:
    if found.num_rows == 0:
        return {}
    sums = found.group_by("run_id").aggregate([("marks", "sum")])
    return {
        r: int(n or 0) for r, n in zip(sums["run_id"].to_pylist(), sums["marks_sum"].to_pylist(), strict=True)
    }


def _part(fetched: _Fetched) -> _Part:
    """One chunk's problems, in the order of the checks' precedence (a gap, then a hash that does
    not match, then a broken link; a hot column that differs says the least), its manifests and its
    blob references."""
    table = fetched.table
    failed = _rehash_failures(table)
    found = table.select(["run_id", "source", "seq", "kind", "hot", "refs", "marks"]).filter(
        pc.or_(pc.is_valid(table.column("hot")), pc.is_valid(table.column("refs")))
    )
    problems: dict[tuple[str, str, int], Problem] = {}
    with_hot = found.filter(pc.is_valid(found.column("hot")))
    for run_id, source, seq, kind, column in zip(
        *(with_hot.column(c).to_pylist() for c in ["run_id", "source", "seq", "kind", "hot"]), strict=True
    ):
        problems[(run_id, source, seq)] = Problem(
            run_id, source, seq, kind, f"hot column {column} differs from the payload (edited after ingest)"
        )
    for (run_id, source, seq), (kind, what) in fetched.chain_problems.items():
        problems[(run_id, source, seq)] = Problem(run_id, source, seq, kind, what)
    edited = table.select(["run_id", "source", "seq", "kind"]).take(pa.array(failed, pa.int64()))
    for run_id, source, seq, kind in zip(*(edited.column(i).to_pylist() for i in range(4)), strict=True):
        key = (run_id, source, seq)
        if key in problems and problems[key].what.startswith("sequence gap"):
            continue
        problems[key] = Problem(run_id, source, seq, kind, HASH_MISMATCH)
    refs = found.column("refs")
    addresses = pc.unique(pc.list_flatten(refs)).to_pylist() if found.num_rows else []
    current = manifests.assemble(
        [(r, s, n, hi, h) for r, s, n, _, hi, h, *_ in fetched.stats], _marks_by_run(found)
    )
    held = {(run_id, source): n for run_id, source, n, *_ in fetched.stats}
    chains = [(run_id, source, started) for run_id, source, *_, started in fetched.stats]
    missing = [Problem(r, None, None, None, why) for r, why in unstarted(chains)]
    missing += [Problem(r, src, None, None, why) for r, src, why in short_sources(fetched.finished, held)]
    return _Part(problems, current, fetched.stored, addresses, missing)


def _parts(
    con: duckdb.DuckDBPyConnection, run_ids: list[str] | None = None, batch: int = HASH_BATCH
) -> Iterator[_Part]:
    """The store's events checked a chunk of runs at a time (``_chunks``): every event's hash
    re-derived, its hot columns and blob references read, every chain checked.

    The database's work runs on one thread (one connection runs one query at a time, and every
    query stays on ``con`` so it sees what the caller sees) one chunk ahead of this thread, which
    hashes the chunk before: at most two chunks in memory, whatever the size of the store."""
    where, params = _run_filter(run_ids)
    hot_columns = hot.stored(con)
    chunks = _chunks(con, where, params, batch)
    # The whole store: the database's cache of the file kept small (``bounded.DATABASE_MEMORY``). Named
    # runs (the viewer's check of one run) leave the limit alone: it is the server's, shared by
    # the queries it answers meanwhile.
    memory = DatabaseMemory(con) if run_ids is None else None

    def fetch(chunk: _Chunk) -> _Fetched:
        cond, values = _chunk_filter(where, params, chunk)

        def step() -> _Fetched:
            return _fetch(con, _scan_sql(cond, hot_columns), cond, values, chunk.runs)

        return step() if memory is None else memory.retrying(step)

    with ThreadPoolExecutor(1) as database, memory or nullcontext():
        pending: Future[_Fetched] | None = None
        for chunk in chunks:
            ahead = database.submit(fetch, chunk)
            if pending is not None:
                yield _part(pending.result())
            pending = ahead
        if pending is not None:
            yield _part(pending.result())


class _Scanned(NamedTuple):
    """Every chunk's findings together (for the checks of events alone, and the tests)."""

    problems: dict[tuple[str, str, int], Problem]
    current: dict[str, dict[str, Any]]
    addresses: References


def _scan(
    con: duckdb.DuckDBPyConnection, run_ids: list[str] | None = None, batch: int = HASH_BATCH
) -> _Scanned:
    scanned = _Scanned({}, {}, References())
    for part in _parts(con, run_ids, batch):
        scanned.problems.update(part.problems)
        scanned.current.update(part.current)
        scanned.addresses.update(part.addresses)
    return scanned


def check_events(
    con: duckdb.DuckDBPyConnection, run_ids: list[str] | None = None, batch: int = HASH_BATCH
) -> list[Problem]:
    """Every event's hash re-derived, every chain and hot column checked; one problem per event."""
    problems = _scan(con, run_ids, batch).problems
    return [problems[k] for k in sorted(problems)]


def _manifest_problems(stored: list[tuple[str, str]], current: dict[str, dict[str, Any]]) -> list[Problem]:
    """Stored manifests (run id, text) compared with the store's current state (``current``)."""
    return _differences([json.loads(text) for _, text in stored], current, "its stored manifest")


def _orphan_manifests(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """The stored manifests of runs that have no events left in the store."""
    rows = con.execute(
        "SELECT run_id, manifest FROM manifests "
        "ANTI JOIN (SELECT DISTINCT run_id FROM events) USING (run_id) ORDER BY run_id"
    ).fetchall()
    return [tuple(r) for r in rows]


def _differences(
    anchored: list[dict[str, Any]], current: dict[str, dict[str, Any]], what: str
) -> list[Problem]:
    problems = []
    for m in anchored:
        run_id = str(m.get("run_id"))
        for diff in manifests.differences(m, current.get(run_id)):
            problems.append(Problem(run_id, None, None, None, f"differs from {what}: {diff}"))
    return problems


def _blob_refs(
    con: duckdb.DuckDBPyConnection, run_ids: list[str] | None, only: list[str] | None = None
) -> list[tuple[str, str, str, int, str]]:
    """Every referenced blob (of ``only``, if given), with the first event (by run, source, seq)
    that refers to it."""
    where, params = _run_filter(run_ids)
    among = "WHERE b IN (SELECT unnest(?::VARCHAR[]))" if only is not None else ""
    return con.execute(
        f"""
        SELECT b, run_id, source, seq, kind
        FROM (SELECT run_id, source, seq, kind, unnest({manifests.BLOB_REF_SQL}) AS b FROM events
              {where + " AND " if where else "WHERE "}{manifests.HAS_BLOB_SQL})
        {among}
        QUALIFY row_number() OVER (PARTITION BY b ORDER BY run_id, source, seq) = 1
        ORDER BY run_id, source, seq, b
        """,
        [*params, *([only] if only is not None else [])],
    ).fetchall()


def _blob_problems(refs: list[tuple[str, str, str, int, str]], bad: dict[str, str]) -> list[Problem]:
    return [
        Problem(run_id, source, seq, kind, bad[blob])
        for blob, run_id, source, seq, kind in refs
        if blob in bad
    ]


def check_blobs(
    con: duckdb.DuckDBPyConnection,
    blobs: BlobStore,
    run_ids: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Problem]:
    refs = _blob_refs(con, run_ids)
    return _blob_problems(refs, verify_many(blobs, [r[0] for r in refs], progress))


def verify(
    con: duckdb.DuckDBPyConnection,
    blobs: BlobStore,
    run_ids: list[str] | None = None,
    anchored: list[dict[str, Any]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    blob_process: bool | None = None,
    batch: int = HASH_BATCH,
) -> list[Problem]:
    """Every problem found, in a stable order: events, manifests, anchored manifests, blobs.

    ``blob_process`` runs the blob pass in child processes (True), in a thread of this one (False),
    or by the bytes of packs (None: from ``blob_pass.PART_MIN``). The events are read a chunk of
    about ``batch`` events (whole runs) at a time."""
    if run_ids:
        known = {r[0] for r in con.execute("SELECT DISTINCT run_id FROM events").fetchall()}
        missing = [
            Problem(r, None, None, None, "no such run in the store") for r in run_ids if r not in known
        ]
        if missing:
            return missing
    # The blob pass (parse, decompress, hash every pack record) starts first and runs beside the
    # scan of the events: in a child process for a big store, so that it and the events' hashing
    # (both Python work) each have a core; else in a thread (DuckDB releases the GIL while it
    # works). Verifying named runs, the references come first: a few runs of a big store read
    # just their blobs (``blobverify.verify_many``). The database's checks stay on ``con``, so
    # they see what it sees (an uncommitted edit, in the tamper tests).
    early = None
    if not run_ids:
        children = blob_pass.children_for(blob_pass.pack_bytes(blobs))
        apart = children > 0 if blob_process is None else blob_process
        early = blob_pass.BlobPass(blobs, progress, apart, max(children, 1))
    events: dict[tuple[str, str, int], Problem] = {}
    stored: list[Problem] = []
    referenced = References()
    try:
        # A chunk of runs at a time (``_parts``): what is kept across chunks is what was found
        # wrong, and the blob addresses (on disk) that the blob pass needs.
        for part in _parts(con, run_ids, batch):
            events.update(part.problems)
            stored += _manifest_problems(part.stored, part.current) + part.missing
            referenced.update(part.addresses)
        if not run_ids:
            stored += _manifest_problems(_orphan_manifests(con), {})
        if early is not None:
            # The blocks the scan left cached let go first: this process joins the blob pass now.
            drop_cache(con)
            bad = early.result(referenced)
        elif blob_process:
            bad = blob_pass.verify_apart(blobs, referenced, progress)
        else:
            bad = verify_many(blobs, list(referenced), progress)
    except BaseException:
        if early is not None:
            early.cancel()
        raise
    finally:
        referenced.close()
    problems = [events[k] for k in sorted(events)]
    problems += sorted(stored, key=lambda p: p.run_id)  # (stable: each run's in the order found)
    if anchored is not None:  # (kept elsewhere: ``--manifest FILE``)
        current = manifests.compute_many(con, [str(m.get("run_id")) for m in anchored])
        problems += _differences(anchored, current, "the anchored manifest")
    return problems + (_blob_problems(_blob_refs(con, run_ids, sorted(bad)), bad) if bad else [])
