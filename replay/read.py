"""Typed read-back: stored events as ``schemas.codec.Event`` objects, upcast to current versions.

Decoding is envelope-first (kind and version come from their columns), so an unknown kind or a
newer version raises ``UnknownEventKind`` / ``NewerEventVersion`` naming the event, not a crash.
Order: within a source by seq; across sources by ts_ns (clocks of different producers may
disagree slightly; seq is the only order a producer guarantees).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from os import PathLike

import duckdb

from schemas.codec import ID_RE, Event, decode_payload
from schemas.errors import BadInput, NotFound, SchemaError, quoted


def iter_events(
    con: duckdb.DuckDBPyConnection, run_id: str, kinds: list[str] | None = None, batch: int = 2048
) -> Iterator[Event]:
    sql = (
        "SELECT run_id, source, seq, ts_ns, kind, v, CAST(payload AS VARCHAR), prev_hash, hash FROM events "
        "WHERE run_id = ?"
    )
    params: list[str] = [run_id]
    if kinds:
        sql += f" AND kind IN ({', '.join('?' for _ in kinds)})"
        params += kinds
    cur = con.execute(sql + " ORDER BY ts_ns, source, seq", params)
    while rows := cur.fetchmany(batch):
        for run, source, seq, ts_ns, kind, v, payload, prev_hash, hash_ in rows:
            try:
                decoded = decode_payload(kind, v, payload.encode())
            except SchemaError as e:
                raise type(e)(f"run {run} source {source} seq {seq}: {e}") from e
            yield Event(
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
