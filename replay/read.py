"""Typed read-back: stored events as ``schemas.codec.Event`` objects, upcast to current versions.

Decoding is envelope-first (kind and version come from their columns), so an unknown kind or a
newer version raises ``UnknownEventKind`` / ``NewerEventVersion`` naming the event, not a crash.
Order: within a source by seq; across sources by ts_ns (clocks of different producers may
disagree slightly; seq is the only order a producer guarantees).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from os import PathLike
from typing import Any

import duckdb

from schemas.codec import ID_RE, Event, decode_payload
from schemas.errors import BadInput, NotFound, SchemaError, quoted

Row = tuple[Any, ...]
"""A row of the events as ``iter_events`` and ``runs_rows`` read it."""

_COLUMNS = "run_id, source, seq, ts_ns, kind, v, CAST(payload AS VARCHAR), prev_hash, hash"
_ORDER = "ts_ns, source, seq"


def iter_events(
    con: duckdb.DuckDBPyConnection, run_id: str, kinds: list[str] | None = None, batch: int = 2048
) -> Iterator[Event]:
    sql = f"SELECT {_COLUMNS} FROM events WHERE run_id = ?"
    params: list[str] = [run_id]
    if kinds:
        sql += f" AND kind IN ({', '.join('?' for _ in kinds)})"
        params += kinds
    cur = con.execute(sql + f" ORDER BY {_ORDER}", params)
    while rows := cur.fetchmany(batch):
        yield from map(event_of, rows)


RowSpans = dict[str, tuple[int, int]]
"""Each run's first and last row id in the events table (``row_spans``)."""


def row_spans(con: duckdb.DuckDBPyConnection) -> RowSpans:
    """Where each run's rows lie in the events table: one pass over the run ids, after which a query
    of a few runs that names their span reads only the row groups it covers."""
    rows = con.execute("SELECT run_id, min(rowid), max(rowid) FROM events GROUP BY run_id").fetchall()
    return {run: (lo, hi) for run, lo, hi in rows}


def runs_rows(
    con: duckdb.DuckDBPyConnection, run_ids: list[str], batch: int = 2048, spans: RowSpans | None = None
) -> dict[str, list[Row]]:
    """The stored rows of several runs, read by one query, each run's in ``iter_events``' order
    (``event_of`` makes each an ``Event``); a run with no events is absent. With ``spans`` (taken
    since the last write to the events) only the row groups between the runs' first and last rows
    are read, so a run's cost does not grow with the store when the runs lie together."""
    if spans is not None:
        known = [spans[r] for r in run_ids if r in spans]
        if not known:
            return {}
        where, params = "rowid BETWEEN ? AND ? AND ", [min(k[0] for k in known), max(k[1] for k in known)]
    else:
        where, params = "", []
    if not run_ids:
        return {}
    marks = ", ".join("?" for _ in run_ids)
    cur = con.execute(
        f"SELECT {_COLUMNS} FROM events WHERE {where}run_id BETWEEN ? AND ? AND run_id IN ({marks}) "
        f"ORDER BY run_id, {_ORDER}",
        [*params, min(run_ids), max(run_ids), *run_ids],  # (the ranges first: cheaper to test than the list)
    )
    out: dict[str, list[Row]] = {}
    while rows := cur.fetchmany(batch):
        for row in rows:
            out.setdefault(row[0], []).append(row)
    return out


def event_of(row: Row) -> Event:
    """One row of ``iter_events``' or ``runs_rows``' query as an ``Event``, its payload decoded."""
    run, source, seq, ts_ns, kind, v, payload, prev_hash, hash_ = row
    try:
        decoded = decode_payload(kind, v, payload.encode())
    except SchemaError as e:
        raise type(e)(f"run {run} source {source} seq {seq}: {e}") from e
    return Event(
        run_id=run,
        source=source,
        seq=seq,
        ts_ns=ts_ns,
        kind=kind,
        v=v,
        payload=decoded,
        prev_hash=prev_hash,
        hash=hash_,
    )


def run_ids(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in con.execute("SELECT DISTINCT run_id FROM events ORDER BY run_id").fetchall()]


def check_run_id(run: str) -> str:
    """``run`` if it can be a run id (every stored run id can), else ``BadInput``."""
    if not ID_RE.match(run):
        raise BadInput(f"{quoted(run)} is not a run id (1-128 of letters, digits, '.', '_', ':', '-')")
    return run


def require_runs(
    con: duckdb.DuckDBPyConnection, runs: Iterable[str], root: str | PathLike[str] | None = None
) -> list[str]:
    """``runs`` without repeats, in the order given, each one held by the store; else ``BadInput``
    for a string that cannot be a run id, or ``NotFound`` naming the first run it does not hold
    (``root``: the store's directory, named in the message)."""
    wanted = [check_run_id(run) for run in dict.fromkeys(runs)]
    if not wanted:
        return wanted
    held = {
        r
        for (r,) in con.execute(
            "SELECT DISTINCT run_id FROM events WHERE run_id IN (SELECT unnest(?))", [wanted]
        ).fetchall()
    }
    missing = [r for r in wanted if r not in held]
    if missing:
        where = f"the store at {root}" if root is not None else "the store"
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise NotFound(f"no run {quoted(missing[0])}{more} in {where} (see `amb runs`)")
    return wanted
