"""The runs: the list (``/api/runs``), one run's header (``/api/runs/RUN``) and a task's grid
(``/api/grid``), all read from one index of every run, built from the runs' summaries
(``replay.summary``: plain scans, no aggregate of the ``runs`` view, which a page must not pay for)
and kept until the store changes; and
a run's checks (``/api/runs/RUN/verify``) and scores (``/api/runs/RUN/scores``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import duckdb
import msgspec
from msgspec import UNSET, UnsetType

from replay import manifest as manifests
from replay.summary import summaries
from replay.verify import verify as verify_store
from replay.web.resource import (
    BadRequest,
    Fraction,
    Limit,
    NotFound,
    Query,
    decode_cursor,
    encode_cursor,
    has_scores,
)
from schemas.blobstore import BlobStore
from schemas.finding import Finding
from schemas.score_row import JSON_COLUMNS, STORED_COLUMNS, ScoreRow, select_list
from schemas.untrusted_json import loads_untrusted

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
    score_min: Fraction | None = None
    score_max: Fraction | None = None
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


class Score(msgspec.Struct):
    """A run's current score under one profile."""

    judge: str
    overall: float | None
    agentic: float | None
    task: float | None
    status: str
    codes: list[str]


class ScanMark(msgspec.Struct):
    """A scanner's current result for a run, as the list filters on it."""

    flagged: bool
    value: Any
    error: bool


class RunRow(msgspec.Struct):
    """A run as the list shows it (``GET /api/runs``)."""

    run_id: str
    task: str | None
    tier: str | None
    agent: str | None
    model: str | None
    backend: str | None
    status: str
    exit_code: int | None
    started_ns: str | None
    duration_s: float | None
    labels: dict[str, str]
    n_events: int
    n_model_calls: int
    n_tool_calls: int
    tokens_in: int
    tokens_out: int
    tokens: int
    track: str | None
    cost_usd: float | None
    scores: dict[str, Score]
    scans: dict[str, ScanMark]
    """The current result of each scanner that looked at the run (``amb scan``)."""


class RunsPage(msgspec.Struct):
    runs: list[RunRow]
    next: str | None
    remaining: int
    total: int
    profiles: list[str]
    scanners: list[str]
    """The scanners whose results the store holds."""
    facets: dict[str, list[str]]
    """The values each filter can take."""


class RunDetail(RunRow):
    """``GET /api/runs/RUN``: the list row, the run's time span, counts per kind and source, and how
    it started and ended."""

    first_ns: str
    last_ns: str
    span_ms: float
    kinds: dict[str, int]
    sources: dict[str, int]
    workspace: str | None
    command: list[str]
    reason: str | None


class GridCell(msgspec.Struct):
    run_id: str
    repeat: str | None
    tier: str | None
    status: str
    overall: float | None
    score_status: str | None
    codes: list[str]


class GridRow(msgspec.Struct):
    agent: str
    """``AGENT · MODEL``."""
    runs: list[GridCell]


class Grid(msgspec.Struct):
    task: str
    profile: str | None
    rows: list[GridRow]
    repeats: int


@dataclass
class RunIndex:
    """Every run's list row, its span of event times, and the scoring profiles seen, as of one state
    of the store."""

    generation: Generation
    rows: list[RunRow]
    spans: dict[str, tuple[int, int]]
    profiles: list[str]
    by_id: dict[str, RunRow] = field(init=False)
    scanners: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_id = {r.run_id: r for r in self.rows}

    def row(self, run_id: str) -> RunRow:
        found = self.by_id.get(run_id)
        if found is None:
            raise NotFound(f"no run {run_id!r} in the store")
        return found


def build_run_index(con: duckdb.DuckDBPyConnection, generation: Generation) -> RunIndex:
    rows: list[RunRow] = []
    spans: dict[str, tuple[int, int]] = {}
    for s in summaries(con):
        rows.append(
            RunRow(
                **s.header(),
                started_ns=None if s.started_ns is None else str(s.started_ns),
                duration_s=s.duration_s,
                labels=s.labels,
                n_events=s.events,
                n_model_calls=s.model_calls,
                n_tool_calls=s.tool_calls,
                tokens_in=s.tokens.input,
                tokens_out=s.tokens.output,
                tokens=s.tokens.input + s.tokens.output,
                track=None,
                cost_usd=s.cost_usd,
                scores={},
                scans={},
            )
        )
        if s.first_ns is not None and s.last_ns is not None:
            spans[s.run_id] = (s.first_ns, s.last_ns)
    index = RunIndex(generation, rows, spans, [])
    index.profiles = _add_scores(con, index.by_id)
    if has_scores(con, "scan_results_current"):
        query = "SELECT run_id, scanner, n_findings, CAST(value AS VARCHAR), error FROM scan_results_current"
        for run_id, scanner, n, value, error in con.execute(query).fetchall():
            v = None if value is None else json.loads(value)
            if (scanned := index.by_id.get(run_id)) is not None:
                flagged = bool(n) and v not in (False, None, 0, "")
                scanned.scans[scanner] = ScanMark(flagged, v, error is not None)
        index.scanners = sorted({s for r in rows for s in r.scans})
    return index


def _add_scores(con: duckdb.DuckDBPyConnection, by_id: dict[str, RunRow]) -> list[str]:
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
        scored.scores[profile] = Score(judge, overall, agentic, task_score, status, list(codes or []))
        scored.track = track or scored.track
        scored.cost_usd = cost if cost is not None else scored.cost_usd
    return sorted(profiles)


def _run_score(row: RunRow, profile: str | None) -> float | None:
    if profile is not None:
        s = row.scores.get(profile)
        return None if s is None else s.overall
    values = [s.overall for s in row.scores.values() if s.overall is not None]
    return max(values) if values else None


def _keeps(q: RunsQuery) -> Callable[[RunRow], bool]:
    """Whether a row passes the query's filters, score range, label and search."""
    if q.label is not None and "=" not in q.label:
        raise BadRequest("label must be KEY=VALUE")
    wanted = {name: getattr(q, name) for name in RUN_FILTERS if getattr(q, name)}
    text = q.q.strip().lower()

    def keep(r: RunRow) -> bool:
        if any((getattr(r, name) or "") != want for name, want in wanted.items()):
            return False
        if q.label is not None:
            k, _, v = q.label.partition("=")
            if r.labels.get(k) != v:
                return False
        if q.score_min is not None or q.score_max is not None:
            s = _run_score(r, q.profile)
            if s is None or (q.score_min is not None and s < q.score_min):
                return False
            if q.score_max is not None and s > q.score_max:
                return False
        if q.scanner is not None:
            mark = r.scans.get(q.scanner)
            if mark is None or not (
                mark.flagged if q.scan_value is None else _text(mark.value) == q.scan_value
            ):
                return False
        if text:
            fields = (r.run_id, r.task, r.agent, r.model, r.status, r.track, r.tier)
            hay = " ".join(str(x or "") for x in fields)
            hay += " " + " ".join(f"{k}={v}" for k, v in r.labels.items())
            if text not in hay.lower():
                return False
        return True

    return keep


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _sort_key(q: RunsQuery) -> Callable[[RunRow], list[Any]]:
    column = RUN_SORTS[q.sort]
    numeric = column in _NUMERIC_SORTS

    def key(r: RunRow) -> list[Any]:
        v = _run_score(r, q.profile) if column == "score" else getattr(r, column)
        if column == "started_ns" and v is not None:
            v = int(v)
        present = v is not None
        # Missing values sort last in both directions.
        return [
            present if q.order == "desc" else not present,
            (v if present else 0) if numeric else str(v or ""),
            r.run_id,
        ]

    return key


def list_runs(index: RunIndex, q: RunsQuery) -> RunsPage:
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
    facets = {name: sorted({str(v) for r in index.rows if (v := getattr(r, name))}) for name in RUN_FILTERS}
    next_page = encode_cursor(key(page[-1])) if more and page else None
    return RunsPage(page, next_page, len(matched), len(index.rows), index.profiles, index.scanners, facets)


def run_detail(con: duckdb.DuckDBPyConnection, index: RunIndex, run_id: str) -> RunDetail:
    """``GET /api/runs/RUN``."""
    row = index.row(run_id)
    # Two queries: counts per kind and source in one pass, then the header and the ending.
    kinds: dict[str, int] = {}
    sources: dict[str, int] = {}
    for kind, source, n in con.execute(
        "SELECT kind, source, count(*) FROM events WHERE run_id = ? GROUP BY ALL ORDER BY 1, 2", [run_id]
    ).fetchall():
        kinds[kind] = kinds.get(kind, 0) + n
        sources[source] = sources.get(source, 0) + n
    workspace = command = reason = None
    # Keys first, payloads second: in one query, DuckDB reads the payload column of the whole run.
    ends = con.execute(
        """SELECT source, seq FROM events WHERE run_id = ? AND kind IN ('run.started', 'run.finished')
           ORDER BY seq, source LIMIT 8""",
        [run_id],
    ).fetchall()
    picked = " OR ".join("(source = ? AND seq = ?)" for _ in ends) or "false"
    for kind, ws, cmd, why in con.execute(
        f"""SELECT kind, payload->>'$.workspace', CAST(payload->'$.command' AS VARCHAR), payload->>'$.reason'
            FROM events WHERE run_id = ? AND ({picked})""",
        [run_id, *(x for key in ends for x in key)],
    ).fetchall():
        if kind == "run.started":
            workspace, command = ws, cmd
        else:
            reason = why
    start_ns, end_ns = index.spans[run_id]
    return RunDetail(
        **msgspec.structs.asdict(row),
        first_ns=str(start_ns),
        last_ns=str(end_ns),
        span_ms=(end_ns - start_ns) / 1e6,
        kinds=kinds,
        sources=dict(sorted(sources.items())),
        workspace=workspace,
        command=_command(command),
        reason=reason,
    )


def _command(text: str | None) -> list[str]:
    """run.started's command as a list of words (none of anything else: only a hostile spool holds it)."""
    try:
        value = loads_untrusted(text) if text else []
    except ValueError:
        return []
    return [w if isinstance(w, str) else json.dumps(w) for w in value] if isinstance(value, list) else []


def grid(index: RunIndex, q: GridQuery) -> Grid:
    """``GET /api/grid?task=T``: every run of one task, agents × repeats, with each run's outcome."""
    runs = [r for r in index.rows if r.task == q.task]
    if not runs:
        raise NotFound(f"no runs of task {q.task!r}")
    profile = q.profile or (index.profiles[0] if index.profiles else None)
    cells: dict[str, list[GridCell]] = {}
    for r in sorted(runs, key=lambda r: (int(r.started_ns or 0), r.run_id)):
        agent = r.labels.get("agent") or r.agent or "?"
        s = r.scores.get(profile) if profile else None
        cells.setdefault(f"{agent} · {r.model or '?'}", []).append(
            GridCell(
                r.run_id,
                r.labels.get("repeat"),
                r.tier,
                r.status,
                s.overall if s else None,
                s.status if s else None,
                s.codes if s else [],
            )
        )
    rows = [GridRow(k, v) for k, v in sorted(cells.items())]
    return Grid(q.task, profile, rows, max(len(v) for v in cells.values()))


class Problem(msgspec.Struct):
    source: str | None
    seq: int | None
    kind: str | None
    what: str
    key: str | None
    """``SOURCE:SEQ`` of the event, when the problem has one."""


class Verified(msgspec.Struct):
    """``GET /api/runs/RUN/verify``: the checks of ``amb verify RUN`` and the run's manifest."""

    ok: bool
    problems: list[Problem]
    """The first 100."""
    n_problems: int
    manifest: dict[str, Any] | None
    stored_manifest: dict[str, Any] | None


def run_verify(con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str) -> Verified:
    found = verify_store(con, blobs, [run_id])
    problems = [
        Problem(p.source, p.seq, p.kind, p.what, None if p.seq is None else f"{p.source}:{p.seq}")
        for p in found[:100]
    ]
    return Verified(
        not found, problems, len(found), manifests.compute(con, run_id), manifests.stored(con, run_id)
    )


class RunScore(ScoreRow, kw_only=True):
    """A run's current score under one (profile, judge): its row of the ``scores`` table, whose
    ``details`` hold its error codes and audit findings with the events they cite (``SOURCE:SEQ``),
    and when it was scored."""

    scored_at: str


class ScanResult(msgspec.Struct):
    """A scanner's current result for the run (``amb scan``)."""

    scanner: str
    version: str
    """The first 12 hex digits of the scanner's identity (its code or query)."""
    scanned_at: str
    findings: list[Finding]
    error: str | None


class RunScores(msgspec.Struct):
    scores: list[RunScore]
    findings: list[ScanResult]
    reason: str | UnsetType = UNSET
    """Why there are no scores."""


def run_scores(con: duckdb.DuckDBPyConnection, run_id: str) -> RunScores:
    """``GET /api/runs/RUN/scores``: the current score per (profile, judge)."""
    found = run_findings(con, run_id)
    if not has_scores(con):
        return RunScores([], found, "nothing in this store has been scored (amb score)")
    stored = {name for (name,) in con.execute(STORED_COLUMNS).fetchall()}
    cur = con.execute(
        f"""SELECT {select_list(stored)}, CAST(scored_at AS VARCHAR) AS scored_at
            FROM scores_current WHERE run_id = ? ORDER BY profile_name, judge""",
        [run_id],
    )
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, values, strict=True)) for values in cur.fetchall()]
    for row in rows:
        row.update({c: json.loads(row[c] or "{}") for c in JSON_COLUMNS})
    return RunScores(msgspec.convert(rows, list[RunScore]), found)


def run_findings(con: duckdb.DuckDBPyConnection, run_id: str) -> list[ScanResult]:
    """The run's current result per scanner: its findings, each citing its events."""
    if not has_scores(con, "scan_results_current"):
        return []
    rows = con.execute(
        """SELECT scanner, scanner_id, CAST(scanned_at AS VARCHAR), CAST(findings AS VARCHAR), error
           FROM scan_results_current WHERE run_id = ? ORDER BY scanner""",
        [run_id],
    ).fetchall()
    return [
        ScanResult(s, v.removeprefix("sha256:")[:12], at, msgspec.json.decode(f, type=list[Finding]), e)
        for s, v, at, f, e in rows
    ]
