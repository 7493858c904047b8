"""Scan results in the store: the ``scanners`` and ``scan_results`` tables, written and read.

Results are append-only rows of ``scan_results`` (one per run and scanner version and scan; the
``scan_id`` of a row written by ``amb score`` is its scoring batch). A run that a version has
already scanned without error is skipped, and an insert skips a (run, version) already stored, so
a resumed scan, two scans at once, or a scan after scoring never duplicate a row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

import duckdb

from schemas.codec import canonical_json
from schemas.finding import Finding
from scorer import ledger
from scorer.scanners import Scanner


class Row(NamedTuple):
    scanner: Scanner
    run_id: str
    found: list[Finding]
    error: str | None = None


def done(con: duckdb.DuckDBPyConnection, s: Scanner, retry_errors: bool) -> set[str]:
    """The runs scanner version ``s`` need not scan again (with ``retry_errors``, failed ones are
    scanned again)."""
    cond = " AND error IS NULL" if retry_errors else ""
    sql = f"SELECT DISTINCT run_id FROM scan_results WHERE scanner_id = ?{cond}"
    return {r for (r,) in con.execute(sql, [s.id]).fetchall()}


def register(con: duckdb.DuckDBPyConnection, s: Scanner) -> None:
    con.execute(
        "INSERT INTO scanners SELECT ?, ?, ?, ?, ? WHERE NOT EXISTS "
        "(SELECT 1 FROM scanners WHERE scanner_id = ?)",
        [s.id, s.name, s.kind, canonical_json(s.content).decode(), ledger.now(), s.id],
    )


def append(con: duckdb.DuckDBPyConnection, scan_id: str, rows: list[Row]) -> None:
    """One insert per chunk; a (run, version) already stored is skipped."""
    if not rows:
        return
    import pyarrow as pa  # here: reading scan results (amb report) needs no Arrow

    table = pa.table(
        {
            "scan_id": [scan_id] * len(rows),
            "scanner_id": [r.scanner.id for r in rows],
            "scanner": [r.scanner.name for r in rows],
            "run_id": [r.run_id for r in rows],
            "scanned_at": ledger.now_column(len(rows)),
            "n_findings": pa.array([len(r.found) for r in rows], pa.int32()),
            "value": [canonical_json(r.found[0].value).decode() if r.found else None for r in rows],
            "findings": [canonical_json([_builtins(f) for f in r.found]).decode() for r in rows],
            "error": pa.array([r.error for r in rows], pa.string()),
        }
    )
    ledger.insert(
        con,
        table,
        "INSERT INTO scan_results SELECT n.* FROM _amb_new n WHERE NOT EXISTS (SELECT 1 FROM "
        "scan_results r WHERE r.scanner_id = n.scanner_id AND r.run_id = n.run_id AND r.error IS NULL)",
    )


def _builtins(f: Finding) -> dict[str, Any]:
    return {"value": f.value, "explanation": f.explanation, "events": f.events}


def shares(con: duckdb.DuckDBPyConnection, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scanner, the share of the scored ``rows``' runs it flagged, per model and per track (runs
    it has not scanned, or failed on, are left out of the share and counted as ``unscanned``). The
    rows are read once, as they come: counted, not kept."""
    got: dict[str, dict[str, bool]] = {}
    query = "SELECT scanner, run_id, n_findings, CAST(value AS VARCHAR), error FROM scan_results_current"
    for scanner, run, n, value, error in con.execute(query).fetchall():
        if error is None:
            got.setdefault(scanner, {})[run] = bool(n) and json.loads(value) not in (False, None, 0, "")
    # (scanner, by, group) -> [runs scanned, flagged, unscanned]
    counts: dict[tuple[str, str, str], list[int]] = {}
    for r in rows if got else ():
        for scanner, flags in got.items():
            flag = flags.get(r["run_id"])
            for by in ("model", "track"):
                c = counts.setdefault((scanner, by, r.get(by) or "?"), [0, 0, 0])
                if flag is None:
                    c[2] += 1
                else:
                    c[0] += 1
                    c[1] += flag
    order = sorted(counts, key=lambda k: (k[0], k[1] != "model", k[2]))
    return [
        {"scanner": s, "by": by, "group": group, "runs": seen, "flagged": flagged}
        | {"share": flagged / seen if seen else None, "unscanned": unscanned}
        for s, by, group in order
        for seen, flagged, unscanned in [counts[s, by, group]]
    ]


def errors(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The current error rows: (scanner, version, run, error) where a scanner's latest try failed."""
    cur = con.execute(
        "SELECT scanner, scanner_id, run_id, error, scanned_at FROM scan_results r WHERE error IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM scan_results o WHERE o.scanner_id = r.scanner_id "
        "AND o.run_id = r.run_id AND o.error IS NULL) ORDER BY scanner, run_id, scanned_at"
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=False)) for row in cur.fetchall()]
