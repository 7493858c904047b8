"""A run's checks (``/api/runs/RUN/verify``, what ``amb verify RUN`` reports) and its scores
(``/api/runs/RUN/scores``, stage by stage, with the events they cite)."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from replay import manifest as manifests
from replay.verify import verify as verify_store
from replay.web.resource import has_scores
from schemas.blobstore import BlobStore


def run_verify(con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str) -> dict[str, Any]:
    """``GET /api/runs/RUN/verify``: the checks of ``amb verify RUN`` and the run's manifest."""
    problems = verify_store(con, blobs, [run_id])
    return {
        "ok": not problems,
        "problems": [
            {
                "source": p.source,
                "seq": p.seq,
                "kind": p.kind,
                "what": p.what,
                "key": f"{p.source}:{p.seq}" if p.source is not None and p.seq is not None else None,
            }
            for p in problems[:100]
        ],
        "n_problems": len(problems),
        "manifest": manifests.compute(con, run_id),
        "stored_manifest": manifests.stored(con, run_id),
    }


def run_scores(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """``GET /api/runs/RUN/scores``: the current score per (profile, judge), stage by stage, with
    each error code and audit finding and the events they cite."""
    found = run_findings(con, run_id)
    if not has_scores(con):
        return {
            "scores": [],
            "reason": "nothing in this store has been scored (amb score)",
            "findings": found,
        }
    cur = con.execute(
        """SELECT profile_name, profile_id, judge, scored_at, s1, s2, s3, s4, s5, agentic, task_score,
                  overall,
                  status, audit_status, turns, wall_s, tokens_in, tokens_out, cost_usd, codes,
                  CAST(reasons AS VARCHAR), CAST(details AS VARCHAR)
           FROM scores_current WHERE run_id = ? ORDER BY profile_name, judge""",
        [run_id],
    )
    cols = [d[0] for d in cur.description]
    out = []
    for values in cur.fetchall():
        r = dict(zip(cols, values, strict=True))
        details = json.loads(r.pop("CAST(details AS VARCHAR)") or "{}")
        r["reasons"] = json.loads(r.pop("CAST(reasons AS VARCHAR)") or "{}")
        r["scored_at"] = str(r["scored_at"])
        r["codes"] = details.get("codes", [])
        r["violations"] = details.get("violations", [])
        r["items"] = details.get("items", [])
        grade = details.get("grade") or {}
        r["grade"] = {
            k: grade.get(k) for k in ("metric", "n_cases", "n_missing", "task_score", "reason") if k in grade
        }
        out.append(r)
    return {"scores": out, "findings": found}


def run_findings(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict[str, Any]]:
    """The run's current result per scanner (``amb scan``): its findings, each citing its events."""
    if not has_scores(con, "scan_results_current"):
        return []
    rows = con.execute(
        """SELECT scanner, scanner_id, CAST(scanned_at AS VARCHAR), CAST(findings AS VARCHAR), error
           FROM scan_results_current WHERE run_id = ? ORDER BY scanner""",
        [run_id],
    ).fetchall()
    return [
        {
            "scanner": s,
            "version": v.removeprefix("sha256:")[:12],
            "scanned_at": at,
            "findings": json.loads(f),
            "error": e,
        }
        for s, v, at, f, e in rows
    ]
