"""Running scanners over stored runs: selection, skip and resume, timeouts, errors, results.

Results are append-only rows of ``scan_results`` (one per run and scanner version and scan); a run
that a version has already scanned is skipped, so a rerun adds nothing and asks no model, and a scan
killed midway resumes where it stopped (rows are written after every chunk of runs, each chunk in
one insert that skips what is already there). A scanner that raises, runs past its timeout or
returns anything but findings leaves an error row for that run, and the scan goes on (unless
``fail_on_error``). SQL scanners and the run selection run first, on the locked read-only connection
of ``amb sql``; Python scanners see typed values only; only this module writes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

from replay.read import iter_events, require_runs
from replay.read import run_ids as all_run_ids
from replay.store import Store, open_sql
from schemas.codec import canonical_json
from schemas.errors import AmbError, BadInput
from schemas.finding import Finding
from scorer import audit as auditor
from scorer import ledger
from scorer.batch import open_store
from scorer.pipeline import task_info
from scorer.profile import LoadedProfile
from scorer.scanners import Malformed, Scanner, findings
from scorer.trajectory import eid, fold


class ScanFailed(AmbError):
    """``--fail-on-error``: a scanner failed on a run (its error row is kept)."""


class Row(NamedTuple):
    scanner: Scanner
    run_id: str
    found: list[Finding]
    error: str | None = None


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
    """run -> findings (or the error text, for every run, when the query fails or is malformed)."""
    try:
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
    except (duckdb.Error, Malformed, TypeError) as e:
        return dict.fromkeys(runs, f"{type(e).__name__}: {str(e).splitlines()[0]}")
    cited = [(run, e) for run, fs in got.items() for f in fs for e in f.events]
    existing = set()
    if cited:
        con.register("_amb_cited", pa.table({"run_id": [c[0] for c in cited], "eid": [c[1] for c in cited]}))
        existing = set(
            con.execute(
                "SELECT c.run_id, c.eid FROM _amb_cited c JOIN events e ON e.run_id = c.run_id "
                "AND e.source || ':' || e.seq = c.eid"
            ).fetchall()
        )
    out: dict[str, Any] = {}
    for run in runs:
        fs = got.get(run, [])
        bad = [e for f in fs for e in f.events if (run, e) not in existing]
        out[run] = f"Malformed: a finding cites {bad[0]!r}, which is not an event of this run" if bad else fs
    return out


def _sql_finding(r: dict[str, Any]) -> Finding:
    value, events = r["value"], r["events"] or []
    if not isinstance(events, list):
        raise Malformed(f"events must be a list of 'source:seq' ids, not {type(events).__name__}")
    plain = value if isinstance(value, bool | int | float | str | type(None)) else str(value)
    return Finding(value=plain, explanation=str(r["explanation"] or ""), events=[str(e) for e in events])


def _call(s: Scanner, arg: Any, event_ids: set[str]) -> tuple[list[Finding], str | None]:
    """One Python scanner on one run, in a daemon thread so that one which hangs is abandoned at its
    timeout (and never holds the process open)."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(findings(s.fn(arg), event_ids))  # type: ignore[misc]
        except BaseException as e:  # the user's code: whatever it raises is that run's error
            box.append(e)

    worker = threading.Thread(target=target, daemon=True, name=f"scanner-{s.name}")
    worker.start()
    worker.join(s.timeout_s)
    if not box:
        return [], f"timeout: still running after {s.timeout_s:g} s"
    if isinstance(box[0], BaseException):
        e = box[0]
        return [], f"{type(e).__name__}: {str(e)[:500]}"
    return box[0], None


class _PerRun:
    """The scanners that read one run at a time (Python, LLM, built-in) over a thread pool."""

    def __init__(self, st: Store, profile: LoadedProfile, scanners: list[Scanner], llm: Any):
        self.st, self.profile, self.scanners, self.llm = st, profile, scanners, llm
        wants = [s.kinds for s in scanners if s.kind == "python"]
        every = any(k is None for k in wants) or any(s.kind != "python" for s in scanners)
        self.kinds = None if every else sorted({k for ks in wants for k in ks or []})
        self.local = threading.local()

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
        out = []
        for s in pending:
            if s.kind == "python":
                found, error = _call(s, traj, ids)
            elif s.kind == "builtin":
                _, forbidden = task_info(traj.task)
                result = auditor.audit(traj, self.profile.profile.audit, list(forbidden))
                found = [
                    Finding(value=v.rule, explanation=v.detail, events=v.events) for v in result.violations
                ]
                error = None
            else:
                found, error = self.llm.ask(s, traj)
            out.append(Row(s, run_id, found, error))
        return out


def _done(con: duckdb.DuckDBPyConnection, s: Scanner, retry_errors: bool) -> set[str]:
    cond = " AND error IS NULL" if retry_errors else ""
    sql = f"SELECT DISTINCT run_id FROM scan_results WHERE scanner_id = ?{cond}"
    return {r for (r,) in con.execute(sql, [s.id]).fetchall()}


def _register(con: duckdb.DuckDBPyConnection, s: Scanner) -> None:
    con.execute(
        "INSERT INTO scanners SELECT ?, ?, ?, ?, ? WHERE NOT EXISTS "
        "(SELECT 1 FROM scanners WHERE scanner_id = ?)",
        [s.id, s.name, s.kind, canonical_json(s.content).decode(), ledger.now(), s.id],
    )


def append(con: duckdb.DuckDBPyConnection, scan_id: str, rows: list[Row]) -> None:
    """One insert per chunk; a (run, version) already stored is skipped, so a resumed scan or two
    scans at once never duplicate a row."""
    if not rows:
        return
    ts = ledger.now()
    table = pa.table(
        {
            "scan_id": [scan_id] * len(rows),
            "scanner_id": [r.scanner.id for r in rows],
            "scanner": [r.scanner.name for r in rows],
            "run_id": [r.run_id for r in rows],
            "scanned_at": pa.array([ts] * len(rows), pa.timestamp("us")),
            "n_findings": pa.array([len(r.found) for r in rows], pa.int32()),
            "value": [canonical_json(r.found[0].value).decode() if r.found else None for r in rows],
            "findings": [canonical_json([_builtins(f) for f in r.found]).decode() for r in rows],
            "error": pa.array([r.error for r in rows], pa.string()),
        }
    )
    con.register("_amb_new_scan", table)
    try:
        con.execute(
            "INSERT INTO scan_results SELECT n.* FROM _amb_new_scan n WHERE NOT EXISTS (SELECT 1 FROM "
            "scan_results r WHERE r.scanner_id = n.scanner_id AND r.run_id = n.run_id AND r.error IS NULL)"
        )
    finally:
        con.unregister("_amb_new_scan")


def _builtins(f: Finding) -> dict[str, Any]:
    return {"value": f.value, "explanation": f.explanation, "events": f.events}


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
    with open_store(store) as st:
        con = st.con
        pending: dict[str, list[str]] = {}
        tallies: dict[str, list[int]] = {}
        for s in scanners:
            _register(con, s)
            done = _done(con, s, retry_errors)
            pending[s.id] = [r for r in selected if r not in done]
            tallies[s.id] = [0, len(selected) - len(pending[s.id]), 0, 0]
        llm = None
        if any(s.kind == "llm" for s in scanners):
            from scorer.scan_llm import Asker

            llm = Asker(st, profile)

        def record(rows: list[Row]) -> None:
            append(con, scan_id, rows)
            if llm is not None:
                ledger.append_judge_calls(con, llm.cache.drain())
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
            record([Row(s, r, *_sql_row(sql_found[s.id][r])) for r in pending[s.id]])
        per_run = [s for s in scanners if s.kind != "sql"]
        _scan_per_run(st, profile, per_run, pending, llm, record, jobs, chunk, progress)
    requests = llm.judge.requests if llm is not None else 0
    return scan_id, [Tally(s, *tallies[s.id]) for s in scanners], requests


def _sql_row(result: Any) -> tuple[list[Finding], str | None]:
    return ([], result) if isinstance(result, str) else (result, None)


def _scan_per_run(
    st: Store,
    profile: LoadedProfile,
    scanners: list[Scanner],
    pending: dict[str, list[str]],
    llm: Any,
    record: Callable[[list[Row]], None],
    jobs: int,
    chunk: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    if not scanners:
        return
    todo: dict[str, list[Scanner]] = {}
    for s in scanners:
        for r in pending[s.id]:
            todo.setdefault(r, []).append(s)
    reader = _PerRun(st, profile, scanners, llm)
    order = sorted(todo)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for start in range(0, len(order), chunk):
            part = order[start : start + chunk]
            rows = [row for rs in pool.map(lambda r: reader.rows(r, todo[r]), part) for row in rs]
            record(rows)
            if progress:
                progress(start + len(part), len(order))


def shares(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scanner, the share of the scored ``rows``' runs it flagged, per model and per track (runs
    it has not scanned, or failed on, are left out of the share and counted as ``unscanned``)."""
    got: dict[str, dict[str, bool]] = {}
    query = "SELECT scanner, run_id, n_findings, CAST(value AS VARCHAR), error FROM scan_results_current"
    for scanner, run, n, value, error in con.execute(query).fetchall():
        if error is None:
            got.setdefault(scanner, {})[run] = bool(n) and json.loads(value) not in (False, None, 0, "")
    out = []
    for scanner, flags in sorted(got.items()):
        for by in ("model", "track"):
            groups: dict[str, list[bool | None]] = {}
            for r in rows:
                groups.setdefault(r.get(by) or "?", []).append(flags.get(r["run_id"]))
            for group, fs in sorted(groups.items()):
                seen = [f for f in fs if f is not None]
                share = sum(seen) / len(seen) if seen else None
                out.append(
                    {"scanner": scanner, "by": by, "group": group, "runs": len(seen), "flagged": sum(seen)}
                    | {"share": share, "unscanned": len(fs) - len(seen)}
                )
    return out


def errors(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The current error rows: (scanner, version, run, error) where a scanner's latest try failed."""
    cur = con.execute(
        "SELECT scanner, scanner_id, run_id, error, scanned_at FROM scan_results r WHERE error IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM scan_results o WHERE o.scanner_id = r.scanner_id "
        "AND o.run_id = r.run_id AND o.error IS NULL) ORDER BY scanner, run_id, scanned_at"
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=False)) for row in cur.fetchall()]
