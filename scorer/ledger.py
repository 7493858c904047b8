"""The ledger: append-only score tables in the store's DuckDB file, written in bulk.

Rows go in as one Arrow table per chunk (``INSERT ... SELECT`` from a registered Arrow table), never
row by row. Nothing is updated: a rescore appends a batch, and ``scores_current`` (a view) shows the
latest row per (run, profile, judge).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from replay.store import open_sql
from schemas.codec import canonical_json
from schemas.errors import UsageError
from schemas.score_row import COLUMNS, JSON_COLUMNS, STORED_COLUMNS, ScoreRow, column_types, select_list
from scorer.judge.cache import CallRecord, KeySet
from scorer.migrations import LATEST_FIRST
from scorer.profile import LoadedProfile

if TYPE_CHECKING:
    import pyarrow as pa

_TYPES = column_types()
_CALL_JSON = frozenset({"settings", "request", "cited", "codes"})
_CALL_TYPES = {"value": "DOUBLE", "unscored_reason": "VARCHAR", **dict.fromkeys(_CALL_JSON, "VARCHAR")}
"""The column type of the judge call fields whose Arrow type is not inferred from their values."""


def _arrow_type(column_type: str) -> pa.DataType:
    """The Arrow type a column of this SQL type is written as (a string for any other type). Arrow is
    imported by the writers alone: the commands that only read scores (amb report) start without it."""
    import pyarrow as pa

    types = {
        "DOUBLE": pa.float64(),
        "INTEGER": pa.int32(),
        "BIGINT": pa.int64(),
        "BOOLEAN": pa.bool_(),
        "VARCHAR[]": pa.list_(pa.string()),
    }
    return types.get(column_type, pa.string())


def new_batch_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def now_column(n: int) -> pa.Array:
    """``now()`` ``n`` times, as the Arrow column of a table's timestamp."""
    import pyarrow as pa

    return pa.array([now()] * n, pa.timestamp("us"))


def register_profile(con: duckdb.DuckDBPyConnection, loaded: LoadedProfile) -> None:
    con.execute(
        "INSERT INTO score_profiles SELECT ?, ?, ?, ? WHERE NOT EXISTS "
        "(SELECT 1 FROM score_profiles WHERE profile_id = ?)",
        [loaded.id, loaded.name, loaded.canonical.decode(), now(), loaded.id],
    )


_CACHED = """SELECT key, model, CAST(settings AS VARCHAR) AS settings, item, run_id, evidence_sha256,
       value, coalesce(reason, '') AS reason, coalesce(CAST(cited AS VARCHAR), '[]') AS cited,
       unscored_reason, coalesce(latency_ms, 0) AS latency_ms, CAST(codes AS VARCHAR) AS codes,
       CAST(answer AS VARCHAR) AS answer
   FROM judge_calls WHERE cacheable AND model = ? {where}
   QUALIFY row_number() OVER (PARTITION BY key ORDER BY created_at) = 1"""
"""The cached verdicts: only the verdict columns (a cache hit needs nothing else, and 10,000 stored
exchanges would otherwise sit in memory), the first record of each key."""


def _cached(cur: duckdb.DuckDBPyConnection) -> dict[str, CallRecord]:
    names = [d[0] for d in cur.description]
    entries = {}
    for row in cur.fetchall():
        r = dict(zip(names, row, strict=True))
        for c in ("settings", "cited", "codes"):
            r[c] = None if r[c] is None else json.loads(r[c])
        entries[r["key"]] = CallRecord(**r, request={}, response="", reply_text="", cacheable=True)
    return entries


class StoredCalls:
    """A store's cached judge calls for one model, read a chunk of runs at a time, so that a scoring
    batch's memory does not grow with the store. The keys are held (8 bytes each): a key of a run
    outside the chunk is read when asked for, and a key the store does not hold costs no query."""

    def __init__(self, con: duckdb.DuckDBPyConnection, model: str):
        self.con, self.model = con, model
        self.keys = KeySet()
        # (Not DISTINCT: a key twice is kept twice, rather than the database hashing them all.)
        cur = con.execute("SELECT key FROM judge_calls WHERE cacheable AND model = ?", [model])
        while rows := cur.fetchmany(1 << 14):
            for (key,) in rows:
                self.keys.add(key)
            self.keys.settle()

    def of_runs(self, run_ids: list[str]) -> dict[str, CallRecord]:
        """The cached records of every key these runs' calls asked (the first of each, whichever
        run it was made for)."""
        if not run_ids:
            return {}
        marks = ", ".join("?" for _ in run_ids)
        where = f"AND key IN (SELECT key FROM judge_calls WHERE run_id IN ({marks}))"
        return _cached(self.con.execute(_CACHED.format(where=where), [self.model, *run_ids]))

    def of_key(self, key: str) -> CallRecord | None:
        """(From a scoring thread: on a cursor of its own.)"""
        with self.con.cursor() as cur:
            return _cached(cur.execute(_CACHED.format(where="AND key = ?"), [self.model, key])).get(key)


def append_judge_calls(con: duckdb.DuckDBPyConnection, records: list[CallRecord]) -> None:
    if not records:
        return
    import pyarrow as pa

    cols: dict[str, Any] = {"created_at": now_column(len(records))}
    for f in CallRecord.__struct_fields__:
        values = [getattr(r, f) for r in records]
        if f in _CALL_JSON:
            values = [None if v is None else canonical_json(v).decode() for v in values]
        cols[f] = pa.array(values, _arrow_type(_CALL_TYPES[f]) if f in _CALL_TYPES else None)
    names = ", ".join(cols)
    insert(con, pa.table(cols), f"INSERT INTO judge_calls ({names}) SELECT {names} FROM _amb_new")


def insert(con: duckdb.DuckDBPyConnection, table: pa.Table, sql: str) -> None:
    """Run ``sql`` with ``table`` registered as ``_amb_new``: one bulk insert, never row by row."""
    con.register("_amb_new", table)
    try:
        con.execute(sql)
    finally:
        con.unregister("_amb_new")


def load_grade_cache(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    return {
        k: json.loads(s)
        for k, s in con.execute("SELECT key, CAST(summary AS VARCHAR) FROM grade_cache").fetchall()
    }


def append_grades(con: duckdb.DuckDBPyConnection, entries: dict[str, dict[str, Any]]) -> None:
    if not entries:
        return
    import pyarrow as pa

    keys = sorted(entries)
    table = pa.table(
        {
            "key": keys,
            "summary": [canonical_json(entries[k]).decode() for k in keys],
            "created_at": now_column(len(keys)),
        }
    )
    skip_known = "WHERE NOT EXISTS (SELECT 1 FROM grade_cache g WHERE g.key = n.key)"
    insert(con, table, f"INSERT INTO grade_cache SELECT * FROM _amb_new n {skip_known}")


def append_rows(
    con: duckdb.DuckDBPyConnection, batch_id: str, rows: list[ScoreRow], start_seq: int = 0
) -> None:
    if not rows:
        return
    import pyarrow as pa

    cols: dict[str, Any] = {
        "batch_id": [batch_id] * len(rows),
        "seq": list(range(start_seq, start_seq + len(rows))),
        "scored_at": now_column(len(rows)),
    }
    for c in COLUMNS:
        values = [getattr(r, c) for r in rows]
        if c in JSON_COLUMNS:
            cols[c] = [canonical_json(v).decode() for v in values]
        else:
            cols[c] = pa.array(values, _arrow_type(_TYPES[c]))
    names = ", ".join(cols)
    insert(con, pa.table(cols), f"INSERT INTO scores ({names}) SELECT {names} FROM _amb_new")


def append_batch(
    con: duckdb.DuckDBPyConnection,
    batch_id: str,
    loaded: LoadedProfile,
    judge: str,
    started: datetime,
    runs: int,
    requests: int,
    args: dict[str, Any],
) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        amb_version = version("amb-recorder")
    except PackageNotFoundError:
        amb_version = "unknown"
    con.execute(
        "INSERT INTO score_batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [batch_id, loaded.id, judge, started, now(), runs, requests, amb_version]
        + [canonical_json(args).decode()],
    )


def _select(con: duckdb.DuckDBPyConnection, columns: Iterable[str]) -> str:
    """The select list of ``columns`` that the store's ``scores`` table holds."""
    stored = {name for (name,) in con.execute(STORED_COLUMNS).fetchall()}
    return select_list(stored, set(columns))


def _query(
    con: duckdb.DuckDBPyConnection,
    profile_id: str | None,
    judge: str | None,
    run_ids: Iterable[str] | None,
    columns: Iterable[str],
) -> duckdb.DuckDBPyConnection:
    """The current rows' query (latest per run, profile and judge), in run order, of ``columns``."""
    ids = None if run_ids is None else list(run_ids)
    filters = (
        ("profile_id = ?", profile_id or None),
        ("judge = ?", judge or None),
        ("list_contains(?, run_id)", ids),
    )
    given = [(cond, value) for cond, value in filters if value is not None]
    where = "".join(f" AND {cond}" for cond, _ in given)
    sql = f"SELECT {_select(con, columns)}, batch_id, scored_at FROM scores_current WHERE true{where}"
    return con.execute(sql + " ORDER BY run_id", [value for _, value in given])


def _decoded(
    cur: duckdb.DuckDBPyConnection, once: Callable[[Any], Any], size: int = 2048
) -> Iterator[dict[str, Any]]:
    """The query's rows as dicts with JSON columns decoded, fetched ``size`` at a time (never all
    rows as tuples and then all again as dicts); ``once`` maps each text value (to share repeated
    ones)."""
    names = [d[0] for d in cur.description]
    decoded = JSON_COLUMNS.intersection(names)

    def hook(obj: dict[str, Any]) -> dict[str, Any]:
        return {k: once(v) for k, v in obj.items()}

    while chunk := cur.fetchmany(size):
        for r in chunk:
            row = {n: once(v) for n, v in zip(names, r, strict=False)}
            for c in decoded:
                row[c] = None if row[c] is None else json.loads(row[c], object_hook=hook)
            yield row


def current(
    con: duckdb.DuckDBPyConnection,
    *,
    profile_id: str | None = None,
    judge: str | None = None,
    run_ids: Iterable[str] | None = None,
    columns: Iterable[str] = COLUMNS,
) -> list[dict[str, Any]]:
    """The current rows (latest per run, profile and judge), as dicts with JSON columns decoded; of
    ``columns`` only, if given (a row's ``details``, decoded, is ten times the rest of it)."""
    # Rows repeat the same few texts (model, track, judge, profile, reasons): each kept once.
    texts: dict[str, str] = {}

    def once(v: Any) -> Any:
        return texts.setdefault(v, v) if isinstance(v, str) else v

    return list(_decoded(_query(con, profile_id, judge, run_ids, columns), once))


_SUPERSEDED = f"""SELECT run_id, batch_id, seq FROM scores WHERE profile_id = ? AND judge = ?
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY {LATEST_FIRST}) > 1"""
"""The rows of a profile and judge that a later row of the same run replaced (as in ``scores_current``)."""


def stream(
    con: duckdb.DuckDBPyConnection, *, profile_id: str, judge: str, columns: Iterable[str] = COLUMNS
) -> Iterator[dict[str, Any]]:
    """The current rows of ``current``, one at a time, in table order (not by run): a caller that
    folds them holds a few rows, where sorting them, or picking each run's latest over whole rows,
    would hold them all. They are read on a cursor of their own, so queries on ``con`` meanwhile
    leave them whole."""
    cur = con.cursor()
    sql = (
        f"WITH superseded AS ({_SUPERSEDED}) SELECT {_select(cur, columns)} FROM scores "
        "ANTI JOIN superseded USING (run_id, batch_id, seq) WHERE profile_id = ? AND judge = ?"
    )
    cur.execute(sql, [profile_id, judge] * 2)
    return _decoded(cur, lambda v: v, size=256)


def require_scores(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a store that was never scored."""
    views = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'scores_current'")
    if not views.fetchall()[0][0]:
        raise UsageError("no scores in this store yet: run `amb score --all` first")


def judge_counts(con: duckdb.DuckDBPyConnection, profile_id: str) -> dict[str, int]:
    """How many current rows (runs) each judge label has under the profile."""
    require_scores(con)
    sql = "SELECT judge, count(DISTINCT run_id) FROM scores WHERE profile_id = ? GROUP BY judge"
    return dict(con.execute(sql, [profile_id]).fetchall())


def current_rows(
    store: str | Path, *profiles: LoadedProfile, columns: Iterable[str] = COLUMNS
) -> list[list[dict[str, Any]]]:
    """The current score rows under each profile (of ``columns``), read from the store at ``store``;
    a store that was never scored is refused."""
    con = open_sql(store)
    try:
        require_scores(con)
        return [current(con, profile_id=p.id, columns=columns) for p in profiles]
    finally:
        con.close()
