"""``amb verify``: re-derive every hash in the store and check every chain, manifest and blob.

The checks are vectorised in SQL: the canonical body of each event is rebuilt from its stored
columns (the contract in ``schemas.codec`` makes that a string concatenation), hashed with DuckDB's
``sha256`` and compared with the stored hash; a window over each (run, source) checks that seqs
run 0, 1, 2, ... and that every ``prev_hash`` is the previous event's hash. Then each finished
run's stored manifest is compared with the store's current state, and every referenced blob is
read back and re-hashed (packs streamed front to back: ``BlobStore.verify_many``).

What each tamper looks like: an edited payload byte or envelope field → hash mismatch at that
event; a deleted event → a seq gap (or, for the last event of a source, a manifest mismatch);
reordered events → hash mismatch (seq is inside the hash) or a broken link; a chain rebuilt by
someone who can write the file → only an anchored manifest (``--manifest``) catches it.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import duckdb
import numpy as np
import pyarrow as pa

from replay import blob_pass, hot
from replay import manifest as manifests
from schemas.blob import HASH_PREFIX
from schemas.blobstore import BlobStore
from schemas.codec import GENESIS

BODY_SQL = (
    """concat('{"kind":"', kind, '","payload":', CAST(payload AS VARCHAR), ',"prev_hash":"', prev_hash,"""
    """ '","run_id":"', run_id, '","seq":', seq, ',"source":"', source, '","ts_ns":', ts_ns,"""
    """ ',"v":', v, '}')"""
)
"""The canonical body rebuilt from the stored columns (see schemas.codec)."""

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


def _hot_mismatches(
    con: duckdb.DuckDBPyConnection, where: str, params: list[Any]
) -> dict[tuple[str, str, int], Problem]:
    """Events whose hot column differs from the one re-derived from their payload.

    The hot columns (``replay.hot``) are outside the hash, so an edit of one alone leaves every
    hash intact; this re-derives each from the payload (one parse per event) and compares. The
    extracted fields are materialised once: inlined, DuckDB parsed each payload again for every
    column the CASE reads (4.2 s against 0.24 s on 59k events)."""
    if not hot.present(con):
        return {}
    paths = ", ".join(f"'$.{c.path}'" for c in hot.HOT_COLUMNS)
    whens = " ".join(
        f"WHEN {c.name} IS DISTINCT FROM {hot.cast(f'hx[{i + 1}]', c)} "
        f"THEN 'hot column {c.name} differs from the payload (edited after ingest)'"
        for i, c in enumerate(hot.HOT_COLUMNS)
    )
    names = ", ".join(c.name for c in hot.HOT_COLUMNS)
    rows = con.execute(
        f"""
        WITH h AS MATERIALIZED (
            SELECT run_id, source, seq, kind, {names}, json_extract_string(payload, [{paths}]) AS hx
            FROM events {where}
        )
        SELECT * FROM (SELECT run_id, source, seq, kind, CASE {whens} END AS what FROM h)
        WHERE what IS NOT NULL
        """,
        params,
    ).fetchall()
    return {(r[0], r[1], r[2]): Problem(*r) for r in rows}


STORED_HEX = (
    f"CASE WHEN starts_with(hash, '{HASH_PREFIX}') THEN substr(hash, {len(HASH_PREFIX) + 1})"
    " ELSE '!' || hash END"
)

HASH_BATCH = 131_072
"""Events per batch of the hash check: a batch's bodies (~70 MB here) are fetched while the one
before is hashed."""


def _bodies(con: duckdb.DuckDBPyConnection, lo: int, hi: int, where: str, params: list[Any]) -> pa.Table:
    """The canonical bodies and stored hashes of the events with ``lo <= rowid < hi``."""
    cond = f"{where} AND" if where else "WHERE"
    return con.sql(
        f"SELECT rowid, {BODY_SQL} AS body, {STORED_HEX} AS hex FROM events {cond} rowid >= ? AND rowid < ?",
        params=[*params, lo, hi],
    ).to_arrow_table()


def _string_slices(column: pa.ChunkedArray) -> tuple[memoryview, list[int]]:
    """A string column's bytes and its offsets (value i is ``data[offsets[i]:offsets[i + 1]]``),
    read from Arrow's buffers without making a Python object per value."""
    array = column.combine_chunks()
    if array.type not in (pa.string(), pa.large_string()):
        array = array.cast(pa.large_string())
    offset_type = np.int32 if array.type == pa.string() else np.int64
    _, offsets, data = array.buffers()
    if data is None:  # every value empty
        return memoryview(b""), [0] * (len(array) + 1)
    starts = np.frombuffer(offsets, dtype=offset_type)[array.offset : array.offset + len(array) + 1]
    return memoryview(data), starts.tolist()


def _rehash_failures(batch: pa.Table) -> list[int]:
    """Row ids of the batch's events whose stored hash is not the sha256 of their body.

    Hashed here rather than with DuckDB's ``sha256``: hashlib's (OpenSSL's) takes a fraction of
    its time per byte, and this loop runs on its own core while DuckDB builds the next batch.
    ``hex`` is the stored hash without its prefix (a hash without the prefix gets a ``!``, which
    no hex digest equals), so a sound batch is one comparison of two lists."""
    data, offsets = _string_slices(batch.column("body"))
    stored = batch.column("hex").to_pylist()
    sha256 = hashlib.sha256
    digests = [sha256(data[a:b]).hexdigest() for a, b in zip(offsets, offsets[1:], strict=False)]
    if digests == stored:
        return []
    rowids = batch.column("rowid").to_pylist()
    return [rowid for rowid, got, want in zip(rowids, digests, stored, strict=True) if got != want]


def _unsound_chains(con: duckdb.DuckDBPyConnection, where: str, params: list[Any]) -> list[tuple[str, str]]:
    """The (run, source) chains that are not sound, found without sorting: a chain is sound exactly
    when its seqs are 0..n-1 with none twice (count, distinct count, min and max say so) and each
    event's ``prev_hash`` is the hash of the event at seq - 1 (``GENESIS`` at seq 0), which an
    anti-join finds. The window that words the problems then runs over these chains only."""
    and_ = f"{where} AND" if where else "WHERE"
    rows = con.execute(
        f"""
        SELECT run_id, source FROM events {where} GROUP BY ALL
        HAVING count(*) <> count(DISTINCT seq) OR min(seq) <> 0 OR max(seq) <> count(*) - 1
        UNION
        SELECT run_id, source FROM events {and_} seq = 0 AND prev_hash <> '{GENESIS}'
        UNION
        SELECT e.run_id, e.source FROM (SELECT * FROM events {and_} seq > 0) AS e
        ANTI JOIN events AS p
          ON p.run_id = e.run_id AND p.source = e.source AND p.seq = e.seq - 1 AND p.hash = e.prev_hash
        ORDER BY 1, 2
        """,
        params * 3,
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def _chain_problems(
    con: duckdb.DuckDBPyConnection, where: str, params: list[Any]
) -> dict[tuple[str, str, int], tuple[str, str]]:
    """Gaps and broken links, by event: (kind, what). A gap says more than a broken link."""
    chains = _unsound_chains(con, where, params)
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
                      SEMI JOIN _amb_unsound USING (run_id, source)) AS events
                WINDOW w AS (PARTITION BY run_id, source ORDER BY seq)
            )
            SELECT run_id, source, seq, kind,
                   CASE WHEN seq <> expected_seq THEN 'sequence gap: seq ' || expected_seq || ' is missing'
                   END AS gap
            FROM e
            WHERE seq <> expected_seq OR prev_hash <> coalesce(prev_stored, '{GENESIS}')
            """
        ).fetchall()
    finally:
        con.unregister("_amb_unsound")
    return {(r[0], r[1], r[2]): (r[3], r[4] or BROKEN_LINK) for r in rows}


def _events_at(con: duckdb.DuckDBPyConnection, rowids: list[int]) -> dict[tuple[str, str, int], str]:
    """(run, source, seq) -> kind of the events with these row ids."""
    if not rowids:
        return {}
    con.register("_amb_rowids", pa.table({"r": pa.array(rowids, pa.int64())}))
    try:
        rows = con.execute(
            "SELECT run_id, source, seq, kind FROM events WHERE rowid IN (SELECT r FROM _amb_rowids)"
        ).fetchall()
    finally:
        con.unregister("_amb_rowids")
    return {(r[0], r[1], r[2]): r[3] for r in rows}


def check_events(
    con: duckdb.DuckDBPyConnection, run_ids: list[str] | None = None, batch: int = HASH_BATCH
) -> list[Problem]:
    """Every event's hash re-derived, every chain checked; one problem per event.

    The database's work runs on one thread in a queue (one connection runs one query at a time,
    and every query stays on ``con`` so it sees what the caller sees): the bodies batch by batch,
    then the chain and hot-column checks, while this thread hashes the batches already fetched."""
    where, params = _run_filter(run_ids)
    # Batches by row id, over the ranges that hold rows (row ids can be sparse: deleted rows, or
    # rows inserted by the caller's open transaction, which are numbered from 2^62).
    buckets = con.execute(
        f"SELECT DISTINCT rowid // {batch} FROM events {where} ORDER BY 1", params
    ).fetchall()
    bad_rowids: list[int] = []
    with ThreadPoolExecutor(1) as database:
        pending: deque[Future[pa.Table]] = deque()

        def queue_checks() -> list[Future[Any]]:
            return [
                database.submit(_chain_problems, con, where, params),
                database.submit(_hot_mismatches, con, where, params),
            ]

        checks: list[Future[Any]] = []
        for i, (bucket,) in enumerate(buckets):
            if len(pending) >= 2:  # at most two batches in memory besides the one being hashed
                bad_rowids += _rehash_failures(pending.popleft().result())
            start = bucket * batch
            pending.append(database.submit(_bodies, con, start, start + batch, where, params))
            if i == 1:  # queued behind the first two batches: the database works while they are hashed
                checks = queue_checks()
        checks = checks or queue_checks()
        while pending:
            bad_rowids += _rehash_failures(pending.popleft().result())
        rehash = database.submit(_events_at, con, bad_rowids).result()
        # One problem per event, in the order of the checks' precedence: a gap, then a hash that
        # does not match, then a broken link; a hot column that differs says the least.
        chains, found = checks[0].result(), checks[1].result()
        for (run_id, source, seq), (kind, what) in chains.items():
            found[(run_id, source, seq)] = Problem(run_id, source, seq, kind, what)
        for key, kind in rehash.items():
            if key in found and found[key].what.startswith("sequence gap"):
                continue
            found[key] = Problem(*key, kind, HASH_MISMATCH)
    return [found[k] for k in sorted(found)]


def check_manifests(con: duckdb.DuckDBPyConnection, run_ids: list[str] | None = None) -> list[Problem]:
    where, params = _run_filter(run_ids)
    stored = con.execute(f"SELECT run_id, manifest FROM manifests {where} ORDER BY run_id", params).fetchall()
    return check_against(con, [json.loads(text) for _, text in stored], "its stored manifest")


def check_against(
    con: duckdb.DuckDBPyConnection, anchored: list[dict[str, Any]], what: str = "the anchored manifest"
) -> list[Problem]:
    """Compare the store with manifests (stored ones, or kept elsewhere: ``--manifest FILE``)."""
    current = manifests.compute_many(con, [str(m.get("run_id")) for m in anchored])
    problems = []
    for m in anchored:
        run_id = str(m.get("run_id"))
        for diff in manifests.differences(m, current.get(run_id)):
            problems.append(Problem(run_id, None, None, None, f"differs from {what}: {diff}"))
    return problems


def _blob_refs(
    con: duckdb.DuckDBPyConnection, run_ids: list[str] | None
) -> list[tuple[str, str, str, int, str]]:
    """Every referenced blob, with the first event (by run, source, seq) that refers to it."""
    where, params = _run_filter(run_ids)
    return con.execute(
        f"""
        SELECT b, min(run_id), arg_min(source, run_id), arg_min(seq, run_id), arg_min(kind, run_id)
        FROM (SELECT run_id, source, seq, kind, unnest({manifests.BLOB_REF_SQL}) AS b FROM events
              {where + " AND " if where else "WHERE "}{manifests.HAS_BLOB_SQL})
        GROUP BY b ORDER BY 2, 3, 4
        """,
        params,
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
    return _blob_problems(refs, blobs.verify_many([r[0] for r in refs], progress))


BLOB_PROCESS_MIN = 20_000
"""From this many referenced blobs the blob pass runs in a child process (``replay.blob_pass``);
below it, starting one costs more than the pass (a few hundred milliseconds)."""


def verify(
    con: duckdb.DuckDBPyConnection,
    blobs: BlobStore,
    run_ids: list[str] | None = None,
    anchored: list[dict[str, Any]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    blob_process: bool | None = None,
) -> list[Problem]:
    """Every problem found, in a stable order: events, manifests, anchored manifests, blobs.

    ``blob_process`` runs the blob pass in a child process (True), in a thread of this one (False),
    or by the number of blobs (None: from ``BLOB_PROCESS_MIN``)."""
    if run_ids:
        known = {r[0] for r in con.execute("SELECT DISTINCT run_id FROM events").fetchall()}
        missing = [
            Problem(r, None, None, None, "no such run in the store") for r in run_ids if r not in known
        ]
        if missing:
            return missing
    refs = _blob_refs(con, run_ids)
    addresses = [r[0] for r in refs]
    apart = len(addresses) >= BLOB_PROCESS_MIN if blob_process is None else blob_process
    # The blob pass (parse, decompress, hash every pack record) runs beside the database's checks:
    # in a child process for a big store, so that it and the events' hash check (both Python
    # work) each have a core; else in a thread (DuckDB releases the GIL while it works). The
    # database's checks stay on ``con``, so they see what it sees (an uncommitted edit, in the
    # tamper tests).
    with ThreadPoolExecutor(1) as pool:
        if apart:
            bad = pool.submit(blob_pass.verify_apart, blobs, addresses, progress)
        else:
            bad = pool.submit(blobs.verify_many, addresses, progress)
        problems = check_events(con, run_ids) + check_manifests(con, run_ids)
        if anchored is not None:
            problems += check_against(con, anchored)
        return problems + _blob_problems(refs, bad.result())
