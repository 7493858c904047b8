"""The runs: the list (``/api/runs``), one run's header (``/api/runs/RUN``) and a task's grid
(``/api/grid``), all read from one index of every run, built in one pass over the store and kept
until the store changes (the runs view aggregates every event; a page must not pay for that)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import duckdb

from replay.summary import summaries
from replay.web.resource import BadRequest, Limit, NotFound, Query, decode_cursor, encode_cursor, has_scores

Sort = Literal[
    "started", "duration", "tokens", "cost", "score", "run", "task", "agent", "model", "status", "events"
]
_COLUMNS = "started_ns duration_s tokens cost_usd score run_id task agent model status n_events".split()
RUN_SORTS = dict(zip(get_args(Sort), _COLUMNS, strict=True))
_NUMERIC_SORTS = {"started_ns", "duration_s", "tokens", "cost_usd", "score", "n_events"}
RUN_FILTERS = ("task", "track", "tier", "agent", "model", "status")
Generation = tuple[int, int, int]


class RunsQuery(Query, frozen=True):
    limit: Limit = 50
    sort: Sort = "started"
    order: Literal["asc", "desc"] = "desc"
    profile: str | None = None
    score_min: float | None = None
    score_max: float | None = None
    label: str | None = None
    q: str = ""
    cursor: str | None = None
    task: str | None = None
    track: str | None = None
    tier: str | None = None
    agent: str | None = None
    model: str | None = None
    status: str | None = None
    scanner: str | None = None
    """Runs the scanner flagged, or with ``scan_value``, runs whose current value it is."""
    scan_value: str | None = None


class GridQuery(Query, frozen=True):
    task: str
    profile: str | None = None


@dataclass
class RunIndex:
    """Every run's list row, and the scoring profiles seen, as of one state of the store."""

    generation: Generation
    rows: list[dict[str, Any]]
    by_id: dict[str, dict[str, Any]]
    profiles: list[str]
    scanners: list[str] = field(default_factory=list)

    def row(self, run_id: str) -> dict[str, Any]:
        found = self.by_id.get(run_id)
        if found is None:
            raise NotFound(f"no run {run_id!r} in the store")
        return found


@dataclass
class RunIndexCache:
    build: Callable[[], RunIndex]
    current: RunIndex | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, generation: Generation) -> RunIndex:
        with self.lock:
            if self.current is None or self.current.generation != generation:
                self.current = self.build()
            return self.current


def build_run_index(con: duckdb.DuckDBPyConnection, generation: Generation) -> RunIndex:
    rows: list[dict[str, Any]] = []
    for s in summaries(con):
        row: dict[str, Any] = {
            **s.header(),
            "started_ns": s.started_ns,
            "duration_s": s.duration_s,
            "labels": s.labels,
            "n_events": s.events,
            "n_model_calls": s.model_calls,
            "n_tool_calls": s.tool_calls,
            "tokens_in": s.tokens.input,
            "tokens_out": s.tokens.output,
            "tokens": s.tokens.input + s.tokens.output,
            "track": None,
            "cost_usd": s.cost_usd,
            "scores": {},
            "scans": {},
        }
        if s.first_ns is not None and s.last_ns is not None:
            row["span_ns"] = (s.first_ns, s.last_ns)
        rows.append(row)
    by_id = {r["run_id"]: r for r in rows}
    index = RunIndex(generation, rows, by_id, _add_scores(con, by_id))
    if has_scores(con, "scan_results_current"):
        query = "SELECT run_id, scanner, n_findings, CAST(value AS VARCHAR), error FROM scan_results_current"
        for run_id, scanner, n, value, error in con.execute(query).fetchall():
            v = None if value is None else json.loads(value)
            if run_id in by_id:
                flagged = bool(n) and v not in (False, None, 0, "")
                by_id[run_id]["scans"][scanner] = {"flagged": flagged, "value": v, "error": error is not None}
        index.scanners = sorted({s for r in rows for s in r["scans"]})
    return index


def _add_scores(con: duckdb.DuckDBPyConnection, by_id: dict[str, dict[str, Any]]) -> list[str]:
    """Each run's current score per profile into its row; the profiles seen."""
    profiles: set[str] = set()
    if not has_scores(con):
        return []
    for run_id, profile, judge, overall, agentic, task_score, track, cost, status, codes in con.execute(
        """SELECT run_id, profile_name, judge, overall, agentic, task_score, track, cost_usd,
                  status, codes
           FROM scores_current ORDER BY scored_at, batch_id, seq"""
    ).fetchall():
        scored = by_id.get(run_id)
        if scored is None:
            continue
        profiles.add(profile)
        scored["scores"][profile] = {
            "judge": judge,
            "overall": overall,
            "agentic": agentic,
            "task": task_score,
            "status": status,
            "codes": list(codes or []),
        }
        scored["track"] = track or scored["track"]
        scored["cost_usd"] = cost if cost is not None else scored["cost_usd"]
    return sorted(profiles)


def _run_score(row: dict[str, Any], profile: str | None) -> float | None:
    scores = row["scores"]
    if profile is not None:
        s = scores.get(profile)
        return None if s is None else s["overall"]
    values = [s["overall"] for s in scores.values() if s["overall"] is not None]
    return max(values) if values else None


def _keeps(q: RunsQuery) -> Callable[[dict[str, Any]], bool]:
    """Whether a row passes the query's filters, score range, label and search."""
    if q.label is not None and "=" not in q.label:
        raise BadRequest("label must be KEY=VALUE")
    wanted = {name: getattr(q, name) for name in RUN_FILTERS if getattr(q, name)}
    text = q.q.strip().lower()

    def keep(r: dict[str, Any]) -> bool:
        if any((r.get(name) or "") != want for name, want in wanted.items()):
            return False
        if q.label is not None:
            k, _, v = q.label.partition("=")
            if r["labels"].get(k) != v:
                return False
        if q.score_min is not None or q.score_max is not None:
            s = _run_score(r, q.profile)
            if s is None or (q.score_min is not None and s < q.score_min):
                return False
            if q.score_max is not None and s > q.score_max:
                return False
        if q.scanner is not None:
            s = r["scans"].get(q.scanner)
            if s is None or not (s["flagged"] if q.scan_value is None else _text(s["value"]) == q.scan_value):
                return False
        if text:
            fields = (r["run_id"], r["task"], r["agent"], r["model"], r["status"], r["track"], r["tier"])
            hay = " ".join(str(x or "") for x in fields)
            hay += " " + " ".join(f"{k}={v}" for k, v in r["labels"].items())
            if text not in hay.lower():
                return False
        return True

    return keep


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _sort_key(q: RunsQuery) -> Callable[[dict[str, Any]], list[Any]]:
    column = RUN_SORTS[q.sort]
    numeric = column in _NUMERIC_SORTS

    def key(r: dict[str, Any]) -> list[Any]:
        v = _run_score(r, q.profile) if column == "score" else r.get(column)
        present = v is not None
        # Missing values sort last in both directions.
        return [
            present if q.order == "desc" else not present,
            (v if present else 0) if numeric else str(v or ""),
            r["run_id"],
        ]

    return key


def list_runs(index: RunIndex, q: RunsQuery) -> dict[str, Any]:
    """``GET /api/runs``: filtered, searched, sorted, one keyset page."""
    key = _sort_key(q)
    matched = sorted(filter(_keeps(q), index.rows), key=key, reverse=q.order == "desc")
    if q.cursor:
        mark = decode_cursor(q.cursor)
        if not isinstance(mark, list) or len(mark) != 3:
            raise BadRequest("bad cursor for this listing")
        matched = [r for r in matched if (key(r) < mark if q.order == "desc" else key(r) > mark)]
    page = matched[: q.limit]
    more = len(matched) > q.limit
    facets = {name: sorted({str(r[name]) for r in index.rows if r.get(name)}) for name in RUN_FILTERS}
    return {
        "runs": [run_row(r) for r in page],
        "next": encode_cursor(key(page[-1])) if more and page else None,
        "remaining": len(matched),
        "total": len(index.rows),
        "profiles": index.profiles,
        "scanners": index.scanners,
        "facets": facets,
    }


def run_row(r: dict[str, Any]) -> dict[str, Any]:
    """A row as the API sends it (its start as a string, its span left out)."""
    out = {k: v for k, v in r.items() if k not in ("started_ns", "span_ns")}
    out["started_ns"] = None if r["started_ns"] is None else str(r["started_ns"])
    return out


def run_summary(con: duckdb.DuckDBPyConnection, index: RunIndex, run_id: str) -> dict[str, Any]:
    """``GET /api/runs/RUN``: the list row plus the run's header, time span and counts per kind."""
    row = index.row(run_id)
    # Two queries: counts per kind and source in one pass, then the header and the ending.
    kinds: dict[str, int] = {}
    sources: dict[str, int] = {}
    for kind, source, n in con.execute(
        "SELECT kind, source, count(*) FROM events WHERE run_id = ? GROUP BY ALL ORDER BY 1, 2", [run_id]
    ).fetchall():
        kinds[kind] = kinds.get(kind, 0) + n
        sources[source] = sources.get(source, 0) + n
    header = reason = None
    # Keys first, payloads second: asked in one query, DuckDB read the payload column of the whole run
    # to extract three fields from two events (about 3x the time of the two small queries).
    ends = con.execute(
        """SELECT source, seq FROM events WHERE run_id = ? AND kind IN ('run.started', 'run.finished')
           ORDER BY seq, source LIMIT 8""",
        [run_id],
    ).fetchall()
    picked = " OR ".join("(source = ? AND seq = ?)" for _ in ends) or "false"
    for kind, workspace, command, why in con.execute(
        f"""SELECT kind, payload->>'$.workspace', CAST(payload->'$.command' AS VARCHAR), payload->>'$.reason'
            FROM events WHERE run_id = ? AND ({picked})""",
        [run_id, *(x for key in ends for x in key)],
    ).fetchall():
        if kind == "run.started":
            header = (workspace, command)
        else:
            reason = (why,)
    start_ns, end_ns = row["span_ns"]
    return {
        **run_row(row),
        "first_ns": str(start_ns),
        "last_ns": str(end_ns),
        "span_ms": (end_ns - start_ns) / 1e6,
        "kinds": kinds,
        "sources": dict(sorted(sources.items())),
        "workspace": header[0] if header else None,
        "command": json.loads(header[1]) if header and header[1] else [],
        "reason": reason[0] if reason else None,
    }


def grid(index: RunIndex, q: GridQuery) -> dict[str, Any]:
    """``GET /api/grid?task=T``: every run of one task, agents × repeats, with each run's outcome."""
    runs = [r for r in index.rows if r["task"] == q.task]
    if not runs:
        raise NotFound(f"no runs of task {q.task!r}")
    profile = q.profile or (index.profiles[0] if index.profiles else None)
    cells: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: (r["started_ns"] or 0, r["run_id"])):
        agent = r["labels"].get("agent") or r["agent"] or "?"
        s = r["scores"].get(profile) if profile else None
        cells.setdefault(f"{agent} · {r['model'] or '?'}", []).append(
            {
                "run_id": r["run_id"],
                "repeat": r["labels"].get("repeat"),
                "tier": r["tier"],
                "status": r["status"],
                "overall": s["overall"] if s else None,
                "score_status": s["status"] if s else None,
                "codes": s["codes"] if s else [],
            }
        )
    return {
        "task": q.task,
        "profile": profile,
        "rows": [{"agent": k, "runs": v} for k, v in sorted(cells.items())],
        "repeats": max(len(v) for v in cells.values()),
    }
