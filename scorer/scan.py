"""Running scanners over stored runs: selection, skip and resume, timeouts, errors.

A scan writes its rows (``scorer.scan_results``) after every chunk of runs, so a run a scanner
version has already scanned is skipped and a killed scan resumes where it stopped. A scanner that
fails on a run leaves an error row for that run, and the scan goes on (unless ``fail_on_error``).
SQL scanners and the run selection run on the locked read-only connection of ``amb sql``; Python
scanners in worker processes (``scorer.scan_worker``); LLM scanners through the judge
(``scorer.scan_llm``). Only this module writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import duckdb

from replay.bounded import DatabaseMemory
from replay.read import iter_events, require_runs
from replay.read import run_ids as all_run_ids
from replay.store import Store, open_sql
from schemas.errors import AmbError, BadInput
from schemas.finding import Finding
from scorer import ledger
from scorer.batch import SCORE_MEMORY, open_store
from scorer.pipeline import audit_run
from scorer.profile import LoadedProfile
from scorer.scan_results import Row, append, done, register
from scorer.scan_worker import Workers
from scorer.scanners import Malformed, Scanner, audit_findings, findings
from scorer.trajectory import eid, fold


class ScanFailed(AmbError):
    """``--fail-on-error``: a scanner failed on a run (its error row is kept)."""


class Tally(NamedTuple):
    scanner: Scanner
    scanned: int
    skipped: int
    flagged: int
    errors: int


def select_runs(store: str | Path | None, runs: list[str] | None, where: str | None) -> list[str]:
    """The runs a scan covers: the ids given, every run (``None``), or those of the ``runs`` view
    matching ``where`` (user SQL, on the locked read-only connection)."""
    con = open_sql(store)
    try:
        if where is None:
            return all_run_ids(con) if runs is None else require_runs(con, runs, store)
        try:
            return [
                r for (r,) in con.execute(f"SELECT run_id FROM runs WHERE {where} ORDER BY run_id").fetchall()
            ]
        except duckdb.Error as e:
            raise BadInput(f"--where {where!r}: {str(e).splitlines()[0]}") from e
    finally:
        con.close()


def _sql_findings(con: duckdb.DuckDBPyConnection, s: Scanner, runs: set[str]) -> dict[str, Any]:
    """run -> findings, or the error text for every run when the query fails, is malformed or runs
    past the scanner's timeout (then it is interrupted: DuckDB stops at its next check)."""
    timer = threading.Timer(s.timeout_s, con.interrupt)
    timer.start()
    try:
        got = _sql_query(con, s, runs)
        existing = _existing(con, [(run, e) for run, fs in got.items() for f in fs for e in f.events])
    except duckdb.InterruptException:
        return dict.fromkeys(runs, f"timeout: the query ran past {s.timeout_s:g} s and was interrupted")
    except (duckdb.Error, Malformed, TypeError) as e:
        return dict.fromkeys(runs, f"{type(e).__name__}: {str(e).splitlines()[0]}")
    finally:
        timer.cancel()
    out: dict[str, Any] = {}
    for run in runs:
        fs = got.get(run, [])
        bad = [e for f in fs for e in f.events if (run, e) not in existing]
        try:
            out[run] = findings(fs, None)
        except Malformed as e:
            out[run] = f"Malformed: {e}"
        if bad:
            out[run] = f"Malformed: a finding cites {bad[0]!r}, which is not an event of this run"
    return out


def _sql_query(con: duckdb.DuckDBPyConnection, s: Scanner, runs: set[str]) -> dict[str, list[Finding]]:
    cur = con.execute(s.content["query"])
    names = [d[0] for d in cur.description or []]
    need = ["run_id", "value", "explanation", "events"]
    if [n for n in need if n not in names]:
        raise Malformed(f"the query returns {names}, not the columns {need}")
    got: dict[str, list[Finding]] = {}
    for row in cur.fetchall():
        r = dict(zip(names, row, strict=False))
        if r["run_id"] in runs:
            got.setdefault(r["run_id"], []).append(_sql_finding(r))
    return got


def _existing(con: duckdb.DuckDBPyConnection, cited: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of the cited (run, event id) pairs are events of the store."""
    if not cited:
        return set()
    import pyarrow as pa  # here: the report, which imports this module's command group, needs no Arrow

    con.register("_amb_cited", pa.table({"run_id": [c[0] for c in cited], "eid": [c[1] for c in cited]}))
    return set(
        con.execute(
            "SELECT c.run_id, c.eid FROM _amb_cited c JOIN events e ON e.run_id = c.run_id "
            "AND e.source || ':' || e.seq = c.eid"
        ).fetchall()
    )


def _sql_finding(r: dict[str, Any]) -> Finding:
    value, events = r["value"], r["events"] or []
    if not isinstance(events, list):
        raise Malformed(f"events must be a list of 'source:seq' ids, not {type(events).__name__}")
    plain = value if isinstance(value, bool | int | float | str | type(None)) else str(value)
    return Finding(value=plain, explanation=str(r["explanation"] or ""), events=[str(e) for e in events])


class _PerRun:
    """The scanners that read one run at a time (Python, LLM, built-in), called from a thread pool."""

    def __init__(self, st: Store, profile: LoadedProfile, scanners: list[Scanner], llm: Any):
        self.st, self.profile, self.scanners, self.llm = st, profile, scanners, llm
        wants = [s.kinds for s in scanners if s.kind == "python"]
        every = any(k is None for k in wants) or any(s.kind != "python" for s in scanners)
        self.kinds = None if every else sorted({k for ks in wants for k in ks or []})
        self.local = threading.local()
        self.workers = Workers([s for s in scanners if s.kind == "python"])

    def rows(self, run_id: str, pending: list[Scanner]) -> list[Row]:
        cur = getattr(self.local, "cur", None)
        if cur is None:
            cur = self.local.cur = self.st.con.cursor()
        try:
            events = list(iter_events(cur, run_id, self.kinds))
            traj = fold(run_id, events, self.st.blobs.get)
        except AmbError as e:
            return [Row(s, run_id, [], f"cannot read the run: {e}") for s in pending]
        ids = {eid(e) for e in events}
        python = [s for s in pending if s.kind == "python"]
        replies = (
            dict(zip([s.id for s in python], self.workers.run(traj, python), strict=True)) if python else {}
        )
        out = []
        for s in pending:
            if s.kind == "python":
                found, error = _checked(replies[s.id].found, replies[s.id].error, ids)
            elif s.kind == "builtin":
                found, error = audit_findings(audit_run(traj, self.profile.profile.audit).violations), None
            else:
                found, error = self.llm.ask(s, traj)
            out.append(Row(s, run_id, found, error))
        return out


def _checked(found: list[Finding], error: str | None, ids: set[str]) -> tuple[list[Finding], str | None]:
    """A worker's reply, with every cited event checked against the run's."""
    if error is not None:
        return [], error
    try:
        return findings(found, ids), None
    except Malformed as e:
        return [], f"Malformed: {e}"


def scan(
    store: str | Path | None,
    profile: LoadedProfile,
    scanners: list[Scanner],
    *,
    runs: list[str] | None = None,
    where: str | None = None,
    jobs: int = 2,
    chunk: int = 100,
    fail_on_error: bool = False,
    retry_errors: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[str, list[Tally], int]:
    """Scan the selected runs; (scan id, per-scanner tallies, model requests made)."""
    selected = select_runs(store, runs, where)
    sql_found: dict[str, dict[str, Any]] = {}
    sql = [s for s in scanners if s.kind == "sql"]
    if sql:
        con = open_sql(store)
        try:
            sql_found = {s.id: _sql_findings(con, s, set(selected)) for s in sql}
        finally:
            con.close()
    scan_id = ledger.new_batch_id()
    # The database's cache of the file kept small while runs are read, as scoring keeps it.
    with open_store(store) as st, DatabaseMemory(st.con, SCORE_MEMORY) as memory:
        con = st.con

        pending: dict[str, list[str]] = {}
        tallies: dict[str, list[int]] = {}
        for s in scanners:
            register(con, s)
            skip = done(con, s, retry_errors)
            pending[s.id] = [r for r in selected if r not in skip]
            tallies[s.id] = [0, len(selected) - len(pending[s.id]), 0, 0]
        llm = None
        if any(s.kind == "llm" for s in scanners):
            from scorer.scan_llm import Asker

            llm = Asker(st, profile)

        def record(rows: list[Row]) -> None:
            memory.retrying(lambda: append(con, scan_id, rows))
            if llm is not None:
                calls = llm.cache.drain()
                memory.retrying(lambda: ledger.append_judge_calls(con, calls))
            for r in rows:
                t = tallies[r.scanner.id]
                t[0] += 1
                t[2] += any(f.value for f in r.found)
                t[3] += r.error is not None
            failed = next((r for r in rows if r.error is not None), None)
            if fail_on_error and failed is not None:
                raise ScanFailed(
                    f"scanner {failed.scanner.name} failed on run {failed.run_id}: {failed.error} "
                    "(its error row is kept; see `amb scan --errors`)"
                )

        for s in sql:
            found = {r: sql_found[s.id][r] for r in pending[s.id]}
            record([Row(s, r, [], f) if isinstance(f, str) else Row(s, r, f) for r, f in found.items()])
        per_run = [s for s in scanners if s.kind != "sql"]
        _scan_per_run(_PerRun(st, profile, per_run, llm), pending, record, jobs, chunk, progress, memory)
        memory.checkpoint()
    requests = llm.judge.requests if llm is not None else 0
    return scan_id, [Tally(s, *tallies[s.id]) for s in scanners], requests


def _scan_per_run(
    reader: _PerRun,
    pending: dict[str, list[str]],
    record: Callable[[list[Row]], None],
    jobs: int,
    chunk: int,
    progress: Callable[[int, int], None] | None,
    memory: DatabaseMemory,
) -> None:
    todo: dict[str, list[Scanner]] = {}
    for s in reader.scanners:
        for r in pending[s.id]:
            todo.setdefault(r, []).append(s)
    order = sorted(todo)
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for start in range(0, len(order), chunk):
                part = order[start : start + chunk]
                if reader.llm is not None:
                    reader.llm.cache.load_runs(part)
                rows = memory.retrying(partial(_read, pool, reader, todo, part))
                record(rows)
                if progress:
                    progress(start + len(part), len(order))
    finally:
        reader.workers.close()


def _read(
    pool: ThreadPoolExecutor, reader: _PerRun, todo: dict[str, list[Scanner]], part: list[str]
) -> list[Row]:
    """The rows of a part of the runs, read side by side."""
    return [row for rs in pool.map(lambda r: reader.rows(r, todo[r]), part) for row in rs]
