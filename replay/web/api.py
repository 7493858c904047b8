"""The viewer's JSON API: every answer the pages show, as plain data (documented in docs/viewer.md).

Paging is by keyset, never by offset: a page carries an opaque cursor naming its last row's sort
key, and the next page is "the rows after that key". Events are ordered by ``(ts_ns, source, seq)``
(clocks of different producers may disagree a little; within a source seq is the order), and a
page can be opened around any event (a deep link) or any time (a click on the timeline). Rows of
lists carry only one-line summaries; bodies are fetched one at a time, on expand, and capped.

Nanosecond timestamps do not fit a JavaScript number, so they travel as strings (``ts_ns``) beside
milliseconds from the run's start (``t_ms``).
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import duckdb

from replay import manifest as manifests
from replay import search
from replay.store import first
from replay.summary import summaries
from replay.verify import verify as verify_store
from schemas import providers
from schemas.blob import DIGEST_RE
from schemas.blobstore import BlobStore
from schemas.display import clip
from schemas.errors import AmbError, BlobError
from schemas.providers import render
from schemas.untrusted_json import loads_untrusted


class NotFound(AmbError):
    """The thing asked for is not in the store (HTTP 404)."""


class BadRequest(AmbError):
    """A parameter the API cannot use (HTTP 400)."""


SUMMARY_CHARS = 200
PAGE_MAX = 500
TEXT_CAP = 20_000
"""Characters of one message's text sent on expand; the raw bytes tab has the rest."""
RAW_CAP = 64 * 1024
"""Bytes of a raw request or response body sent inline; the whole body is a blob download."""
MESSAGES_CAP = 300
IMAGE_CAP = 8 * 1024 * 1024
"""Largest image the viewer serves for display (bigger ones are downloads)."""

LANES = {
    "model_call.completed": "model",
    "tool_call.requested": "tool",
    "tool_call.result": "tool",
    "process.exited": "process",
    "file.written": "file",
    "file.deleted": "file",
    "file.renamed": "file",
    "file.accessed": "file",
    "network.request": "network",
}
"""Timeline lane of each kind; every other kind (run boundaries, notes, submission) is ``run``."""

PAYLOAD_CAP = 64 * 1024
"""Payloads up to this size are summarised from their JSON; a bigger one by its first characters."""


def summarize_event(kind: str, p: dict[str, Any]) -> tuple[str, float | None, bool, list[int] | None]:
    """One line for the event list, its duration, whether it failed, and (model calls) its tokens.

    Done in Python on purpose: the same CASE over JSON paths in SQL costs DuckDB ~80 ms of
    planning per query, whatever the number of rows."""

    def g(key: str, default: Any = None) -> Any:
        v = p.get(key, default)
        return default if v is None else v

    dur: float | None = None
    bad = False
    tokens = None
    if kind == "model_call.completed":
        msg = g("message", {})
        tools = [t.get("name", "?") for t in msg.get("tool_calls") or [] if isinstance(t, dict)]
        parts = [f"{g('model', '?')} · {g('api', '')}"]
        if not g("ok", True):
            bad = True
            parts.append(f"FAILED {g('error', '')}")
        if msg.get("text"):
            parts.append(str(msg["text"])[:SUMMARY_CHARS])
        text = " · ".join(parts) + (f" → {', '.join(tools)}" if tools else "")
        dur = p.get("latency_ms")
        usage = g("usage", {})
        tokens = [usage.get("input_total", 0), usage.get("output", 0)]
    elif kind == "tool_call.requested":
        text = f"{g('name', '?')}({str(g('arguments', ''))[:SUMMARY_CHARS]})"
    elif kind == "tool_call.result":
        text = f"{g('name', 'result')} → {str(g('output', ''))[:SUMMARY_CHARS]}"
        bad = bool(g("is_error", False))
    elif kind == "process.exited":
        argv = " ".join(str(a) for a in g("argv", []))[:SUMMARY_CHARS]
        code = p.get("exit_code")
        text = f"{argv} → " + (f"exit {code}" if code is not None else f"signal {g('signal', '?')}")
        bad = code != 0
        if p.get("end_ns") and p.get("start_ns"):
            dur = (p["end_ns"] - p["start_ns"]) / 1e6
    elif kind == "file.written":
        text = f"{g('op', '')} {str(g('path', ''))[:SUMMARY_CHARS]} ({g('size', 0)} B)"
    elif kind == "file.deleted":
        text = f"deleted {str(g('path', ''))[:SUMMARY_CHARS]}"
    elif kind == "file.renamed":
        text = f"{str(g('src', ''))[:100]} → {str(g('dst', ''))[:100]}"
    elif kind == "file.accessed":
        text = f"opened ({g('mode', '')}) {str(g('path', ''))[:SUMMARY_CHARS]}"
    elif kind == "network.request":
        outcome = p.get("status") if p.get("status") is not None else g("error", "?")
        text = f"{g('method', '')} {g('host', '')}{str(g('path', ''))[:120]} → {outcome} via {g('via', '')}"
        dur = p.get("duration_ms")
        bad = p.get("error") is not None
    elif kind == "note":
        text = str(g("text", ""))
    elif kind == "run.started":
        text = f"{g('agent', '?')} on {g('task', '-')} ({g('model', '?')})"
    elif kind == "run.finished":
        text = f"{g('status', '?')}, exit {g('exit_code', '-')}" + (
            f": {p['reason']}" if p.get("reason") else ""
        )
    elif kind == "submission.sealed":
        text = f"{len(g('files', []))} files sealed"
    else:
        text = json.dumps(p)[:SUMMARY_CHARS]
    return text, (float(dur) if isinstance(dur, (int, float)) else None), bad, tokens


def _clip(text: str | None, n: int = SUMMARY_CHARS) -> str:
    return clip((text or "").replace("\n", " ⏎ "), n)


def encode_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(text: str) -> Any:
    try:
        return loads_untrusted(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error) as e:
        raise BadRequest(f"bad cursor {text[:40]!r}: {e}") from None


def _limit(value: str | None, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise BadRequest(f"limit must be a whole number, not {value[:20]!r}") from None
    if not 1 <= n <= PAGE_MAX:
        raise BadRequest(f"limit must be between 1 and {PAGE_MAX}")
    return n


def _float(value: str | None, name: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        raise BadRequest(f"{name} must be a number, not {value[:20]!r}") from None


def parse_key(text: str) -> tuple[str, int]:
    """``SOURCE:SEQ`` (the deep-link form, also what scores cite) into its parts."""
    source, sep, seq = text.rpartition(":")
    if not sep or not source or not seq.isdigit():
        raise BadRequest(f"bad event key {text[:60]!r}: expected SOURCE:SEQ")
    return source, int(seq)


def has_scores(con: duckdb.DuckDBPyConnection) -> bool:
    row = first(con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'scores_current'"))
    return bool(row and row[0])


# ---------------------------------------------------------------- runs


RUN_SORTS = {
    "started": "started_ns",
    "duration": "duration_s",
    "tokens": "tokens",
    "cost": "cost_usd",
    "score": "score",
    "run": "run_id",
    "task": "task",
    "agent": "agent",
    "model": "model",
    "status": "status",
    "events": "n_events",
}
_NUMERIC_SORTS = {"started_ns", "duration_s", "tokens", "cost_usd", "score", "n_events"}
RUN_FILTERS = ("task", "track", "tier", "agent", "model", "status")


@dataclass
class RunIndex:
    """Every run's list row, built with one pass over the store and kept until the store changes
    (the runs view aggregates every event; a page must not pay for that)."""

    generation: tuple[int, int, int]
    rows: list[dict[str, Any]]
    by_id: dict[str, dict[str, Any]]
    profiles: list[str]


@dataclass
class RunIndexCache:
    build: Callable[[], RunIndex]
    current: RunIndex | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, generation: tuple[int, int, int]) -> RunIndex:
        with self.lock:
            if self.current is None or self.current.generation != generation:
                self.current = self.build()
            return self.current


def build_run_index(con: duckdb.DuckDBPyConnection, generation: tuple[int, int, int]) -> RunIndex:
    rows: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
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
        }
        if s.first_ns is not None and s.last_ns is not None:
            row["span_ns"] = (s.first_ns, s.last_ns)
        rows.append(row)
        by_id[s.run_id] = row
    profiles: set[str] = set()
    if has_scores(con):
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
    return RunIndex(generation, rows, by_id, sorted(profiles))


def _run_score(row: dict[str, Any], profile: str | None) -> float | None:
    scores = row["scores"]
    if profile is not None:
        s = scores.get(profile)
        return None if s is None else s["overall"]
    values = [s["overall"] for s in scores.values() if s["overall"] is not None]
    return max(values) if values else None


def list_runs(index: RunIndex, params: dict[str, str]) -> dict[str, Any]:
    """``GET /api/runs``: filtered, searched, sorted, one keyset page."""
    limit = _limit(params.get("limit"), 50)
    sort = params.get("sort", "started")
    if sort not in RUN_SORTS:
        raise BadRequest(f"sort must be one of {', '.join(RUN_SORTS)}")
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("order must be asc or desc")
    profile = params.get("profile") or None
    smin, smax = _float(params.get("score_min"), "score_min"), _float(params.get("score_max"), "score_max")
    label = params.get("label") or None
    if label is not None and "=" not in label:
        raise BadRequest("label must be KEY=VALUE")
    q = (params.get("q") or "").strip().lower()

    def keep(r: dict[str, Any]) -> bool:
        for name in RUN_FILTERS:
            want = params.get(name)
            if want and (r.get(name) or "") != want:
                return False
        if label is not None:
            k, _, v = label.partition("=")
            if r["labels"].get(k) != v:
                return False
        if smin is not None or smax is not None:
            s = _run_score(r, profile)
            if s is None or (smin is not None and s < smin) or (smax is not None and s > smax):
                return False
        if q:
            hay = " ".join(
                str(x or "")
                for x in (r["run_id"], r["task"], r["agent"], r["model"], r["status"], r["track"], r["tier"])
            )
            hay += " " + " ".join(f"{k}={v}" for k, v in r["labels"].items())
            if q not in hay.lower():
                return False
        return True

    column = RUN_SORTS[sort]
    numeric = column in _NUMERIC_SORTS

    def key(r: dict[str, Any]) -> list[Any]:
        v = _run_score(r, profile) if column == "score" else r.get(column)
        present = v is not None
        # Missing values sort last in both directions.
        return [
            present if order == "desc" else not present,
            (v if present else 0) if numeric else str(v or ""),
            r["run_id"],
        ]

    matched = [r for r in index.rows if keep(r)]
    matched.sort(key=key, reverse=order == "desc")
    after = params.get("cursor")
    if after:
        mark = decode_cursor(after)
        if not isinstance(mark, list) or len(mark) != 3:
            raise BadRequest("bad cursor for this listing")
        if order == "desc":
            matched = [r for r in matched if key(r) < mark]
        else:
            matched = [r for r in matched if key(r) > mark]
    page = matched[:limit]
    more = len(matched) > limit
    facets = {name: sorted({str(r[name]) for r in index.rows if r.get(name)}) for name in RUN_FILTERS}
    return {
        "runs": [_run_row(r) for r in page],
        "next": encode_cursor(key(page[-1])) if more and page else None,
        "remaining": len(matched),
        "total": len(index.rows),
        "profiles": index.profiles,
        "facets": facets,
    }


def _run_row(r: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in r.items() if k not in ("started_ns", "span_ns")}
    out["started_ns"] = None if r["started_ns"] is None else str(r["started_ns"])
    return out


def run_summary(con: duckdb.DuckDBPyConnection, index: RunIndex, run_id: str) -> dict[str, Any]:
    """``GET /api/runs/RUN``: the list row plus the run's header, time span and counts per kind."""
    row = index.by_id.get(run_id)
    if row is None:
        raise NotFound(f"no run {run_id!r} in the store")
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
        **_run_row(row),
        "first_ns": str(start_ns),
        "last_ns": str(end_ns),
        "span_ms": (end_ns - start_ns) / 1e6,
        "kinds": kinds,
        "sources": dict(sorted(sources.items())),
        "workspace": header[0] if header else None,
        "command": json.loads(header[1]) if header and header[1] else [],
        "reason": reason[0] if reason else None,
    }


def _run_start(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    row = first(con.execute("SELECT min(ts_ns) FROM events WHERE run_id = ?", [run_id]))
    if row is None or row[0] is None:
        raise NotFound(f"no run {run_id!r} in the store")
    return int(row[0])


# ---------------------------------------------------------------- events


def _event_row(source: str, seq: int, ts_ns: int, kind: str, payload: Any, start_ns: int) -> dict[str, Any]:
    if isinstance(payload, dict):
        summary, dur_ms, flagged, tokens = summarize_event(kind, payload)
    else:  # too big to parse for one line: its first characters
        summary, dur_ms, flagged, tokens = str(payload), None, False, None
    out: dict[str, Any] = {
        "key": f"{source}:{seq}",
        "source": source,
        "seq": seq,
        "ts_ns": str(ts_ns),
        "t_ms": round((ts_ns - start_ns) / 1e6, 3),
        "kind": kind,
        "lane": LANES.get(kind, "run"),
        "summary": _clip(summary),
    }
    if dur_ms is not None:
        out["dur_ms"] = round(dur_ms, 3)
    if flagged:
        out["flagged"] = True
    if tokens is not None:
        out["tokens"] = tokens
    return out


def _after(inclusive: bool) -> str:
    op = ">=" if inclusive else ">"
    return f"(ts_ns > ? OR (ts_ns = ? AND (source > ? OR (source = ? AND seq {op} ?))))"


def _before() -> str:
    return "(ts_ns < ? OR (ts_ns = ? AND (source < ? OR (source = ? AND seq < ?))))"


def events_page(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    params: dict[str, str],
    start_ns: int | None = None,
    spacing_ns: float | None = None,
) -> dict[str, Any]:
    """``GET /api/runs/RUN/events``: one page, opened ``around`` an event (``SOURCE:SEQ``) or a time
    (``at_ms`` from the run's start), or continued ``after``/``before`` a cursor. ``start_ns``: the
    run's first event time, and ``spacing_ns``, the mean time between its events, when the caller
    knows them (the run index does)."""
    if start_ns is None:
        start_ns = _run_start(con, run_id)
    limit = _limit(params.get("limit"), 100)
    where = ["run_id = ?"]
    args: list[Any] = [run_id]
    kinds = [k for k in (params.get("kinds") or "").split(",") if k]
    if kinds:
        where.append(f"kind IN ({', '.join('?' for _ in kinds)})")
        args += kinds
    hide = [k for k in (params.get("hide") or "").split(",") if k]
    if hide:
        where.append(f"kind NOT IN ({', '.join('?' for _ in hide)})")
        args += hide
    q = params.get("q") or ""
    if q:
        condition, arg = search.matches(con, q)
        where.append(condition)
        args.append(arg)
    base = "SELECT source, seq, ts_ns FROM events WHERE " + " AND ".join(where)
    target: str | None = None

    def keys(mark: tuple[int, str, int], forward: bool, inclusive: bool, n: int) -> list[tuple[str, int]]:
        # Keys first (a top-N on the run's ordering), summaries second, for those rows only. The
        # SQL bound is on ts_ns alone (a plain range DuckDB can prune storage blocks with); rows
        # tied on ts_ns are put in order here, and the full keyset condition is used only when
        # more than a few of them share the mark's time.
        order = "ASC" if forward else "DESC"
        op = ">=" if forward else "<="
        slack = 32

        def top(bound: str = "", edge: list[int] | None = None) -> list[Any]:
            return con.execute(
                f"{base} AND ts_ns {op} ? {bound} "
                f"ORDER BY ts_ns {order}, source {order}, seq {order} LIMIT {n + slack}",
                [*args, mark[0], *(edge or [])],
            ).fetchall()

        rows = None
        if spacing_ns and not kinds and not q:
            # A top-N from the mark to the run's end reads every row in between (half the run, for a
            # deep link into its middle). Asked first within a window that should hold four times
            # the rows wanted at the run's mean rate: when it holds enough, they are the same first
            # rows (every row past the window sorts after every row in it); else the whole rest.
            reach = int(spacing_ns * (n + slack) * 4) + 1
            rows = top(f"AND ts_ns {'<=' if forward else '>='} ?", [mark[0] + (reach if forward else -reach)])
            if len(rows) < n + slack:
                rows = None
        if rows is None:
            rows = top()
        if forward:
            keep = [
                (src, seq)
                for src, seq, ts in rows
                if (ts, src, seq) > mark or (inclusive and (ts, src, seq) == mark)
            ]
        else:
            keep = [(src, seq) for src, seq, ts in rows if (ts, src, seq) < mark]
        if len(rows) == n + slack and len(keep) < n:
            cond = _after(inclusive) if forward else _before()
            rows = con.execute(
                f"{base} AND {cond} ORDER BY ts_ns {order}, source {order}, seq {order} LIMIT {n}",
                [*args, mark[0], mark[0], mark[1], mark[1], mark[2]],
            ).fetchall()
            keep = [(src, seq) for src, seq, _ in rows]
        return keep[:n]

    if params.get("after") or params.get("before"):
        forward = bool(params.get("after"))
        mark = decode_cursor(params.get("after") or params.get("before") or "")
        if not (isinstance(mark, list) and len(mark) == 3):
            raise BadRequest("bad events cursor")
        got = keys((int(mark[0]), str(mark[1]), int(mark[2])), forward, False, limit + 1)
        more = len(got) > limit
        got = got[:limit]
        if not forward:
            got.reverse()
        rows = _summaries(con, run_id, got, start_ns)
        return {
            "events": rows,
            "next": _cursor(rows[-1]) if forward and more and rows else None,
            "prev": _cursor(rows[0]) if not forward and more and rows else None,
            "start_ns": str(start_ns),
        }
    if params.get("around"):
        source, seq = parse_key(params["around"])
        hit = first(
            con.execute(
                "SELECT ts_ns FROM events WHERE run_id = ? AND source = ? AND seq = ?", [run_id, source, seq]
            )
        )
        if hit is None:
            raise NotFound(f"no event {source}:{seq} in run {run_id!r}")
        ts = int(hit[0])
        target = f"{source}:{seq}"
    elif params.get("at_ms"):
        at = _float(params.get("at_ms"), "at_ms") or 0.0
        ts, source, seq = start_ns + int(at * 1e6), "", -1
    else:
        ts, source, seq = start_ns - 1, "", -1
    # Opened at the run's start nothing comes before: the whole page follows, and no query for it.
    half = max(limit // 2, 1) if ts >= start_ns else 0
    after = keys((ts, source, seq), True, True, limit - half + 1)
    before = keys((ts, source, seq), False, False, half + 1) if half else []
    more_after, more_before = len(after) > limit - half, len(before) > half
    after, before = after[: limit - half], before[:half]
    before.reverse()
    rows = _summaries(con, run_id, before + after, start_ns)
    return {
        "events": rows,
        "target": target,
        "next": _cursor(rows[-1]) if more_after and rows else None,
        "prev": _cursor(rows[0]) if more_before and rows else None,
        "start_ns": str(start_ns),
    }


def _summaries(
    con: duckdb.DuckDBPyConnection, run_id: str, keys: list[tuple[str, int]], start_ns: int
) -> list[dict[str, Any]]:
    """The list rows of ``keys``, in the order given."""
    if not keys:
        return []
    by_source: dict[str, list[int]] = {}
    for src, seq in keys:
        by_source.setdefault(src, []).append(seq)
    # Per source, a seq range (DuckDB skips storage blocks by their min/max) and the seqs themselves,
    # one SELECT each: conditions joined by OR are not pushed into the scan, which then read the
    # payload of every event of the run (180 ms for a page holding three sources); and scattered
    # keys (search hits, one kind) span most of a source, whose every payload in the range was read.
    one = f"""SELECT source, seq, ts_ns, kind,
                     CASE WHEN strlen(CAST(payload AS VARCHAR)) <= {PAYLOAD_CAP}
                          THEN CAST(payload AS VARCHAR) END,
                     left(CAST(payload AS VARCHAR), {SUMMARY_CHARS})
              FROM events WHERE run_id = ? AND source = ? AND seq BETWEEN ? AND ? AND seq IN ({{}})"""
    selects, cargs = [], []
    for src, seqs in by_source.items():
        selects.append(one.format(", ".join("?" for _ in seqs)))
        cargs += [run_id, src, min(seqs), max(seqs), *seqs]
    wanted = set(keys)
    rows = con.execute(" UNION ALL ".join(selects), cargs).fetchall()
    found = {
        (src, seq): _event_row(src, seq, ts, kind, json.loads(full) if full is not None else prefix, start_ns)
        for src, seq, ts, kind, full, prefix in rows
        if (src, seq) in wanted
    }
    return [found[k] for k in keys if k in found]


def _cursor(row: dict[str, Any]) -> str:
    return encode_cursor([row["ts_ns"], row["source"], row["seq"]])


def event_detail(con: duckdb.DuckDBPyConnection, run_id: str, source: str, seq: int) -> dict[str, Any]:
    """``GET /api/runs/RUN/events/SOURCE/SEQ``: one event in full (its payload and envelope)."""
    row = first(
        con.execute(
            """SELECT kind, v, ts_ns, CAST(payload AS VARCHAR), prev_hash, hash,
                      strlen(CAST(payload AS VARCHAR))
               FROM events WHERE run_id = ? AND source = ? AND seq = ?""",
            [run_id, source, seq],
        )
    )
    if row is None:
        raise NotFound(f"no event {source}:{seq} in run {run_id!r}")
    kind, v, ts_ns, payload, prev_hash, hash_, size = row
    body: Any = json.loads(payload) if size <= 4 * RAW_CAP else {"_truncated": payload[: 4 * RAW_CAP]}
    return {
        "key": f"{source}:{seq}",
        "source": source,
        "seq": seq,
        "kind": kind,
        "v": v,
        "ts_ns": str(ts_ns),
        "payload": body,
        "payload_bytes": size,
        "prev_hash": prev_hash,
        "hash": hash_,
    }


# ---------------------------------------------------------------- model calls


def request_messages(api: str, body: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The conversation a request carried, one entry per message, texts capped; and its inline images."""
    return render.for_person(providers.conversation(api, body), TEXT_CAP, _clip)


def _raw(blobs: BlobStore, ref: dict[str, Any] | None) -> tuple[bytes | None, dict[str, Any] | None]:
    if not ref:
        return None, None
    try:
        data = blobs.get(ref["blob"])
    except BlobError as e:
        return None, {"blob": ref["blob"], "size": ref.get("size"), "error": str(e)}
    return data, {
        "blob": ref["blob"],
        "size": len(data),
        "media_type": ref.get("media_type"),
        "text": data[:RAW_CAP].decode("utf-8", "replace"),
        "truncated": len(data) > RAW_CAP,
    }


def _call_payload(con: duckdb.DuckDBPyConnection, run_id: str, source: str, seq: int) -> dict[str, Any]:
    row = first(
        con.execute(
            "SELECT kind, CAST(payload AS VARCHAR) FROM events WHERE run_id = ? AND source = ? AND seq = ?",
            [run_id, source, seq],
        )
    )
    if row is None:
        raise NotFound(f"no event {source}:{seq} in run {run_id!r}")
    if row[0] != "model_call.completed":
        raise BadRequest(f"event {source}:{seq} is a {row[0]}, not a model call")
    payload: dict[str, Any] = json.loads(row[1])
    return payload


def model_call(
    con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, source: str, seq: int
) -> dict[str, Any]:
    """``GET /api/runs/RUN/calls/SOURCE/SEQ``: a model call's messages, reply and raw bytes (capped)."""
    p = _call_payload(con, run_id, source, seq)
    req, request_raw = _raw(blobs, p.get("request"))
    _, response_raw = _raw(blobs, p.get("response"))
    messages: list[dict[str, Any]] = []
    images: list[str] = []
    parse_error = None
    if req is not None:
        try:
            messages, images = request_messages(p.get("api", ""), loads_untrusted(req))
        except ValueError as e:
            parse_error = f"the request body is not JSON: {e}"
    elided = 0
    if len(messages) > MESSAGES_CAP:
        elided = len(messages) - MESSAGES_CAP
        messages = (
            messages[:20] + [{"role": "elided", "text": f"{elided} messages not shown"}] + messages[-280:]
        )
    msg = p.get("message") or {}
    return {
        "key": f"{source}:{seq}",
        "call_id": p.get("call_id"),
        "provider": p.get("provider"),
        "api": p.get("api"),
        "model": p.get("model"),
        "stream": p.get("stream"),
        "status": p.get("status"),
        "ok": p.get("ok"),
        "error": p.get("error"),
        "stop_reason": p.get("stop_reason"),
        "usage": p.get("usage"),
        "ttfb_ms": p.get("ttfb_ms"),
        "latency_ms": p.get("latency_ms"),
        "messages": messages,
        "messages_elided": elided,
        "images": len(images),
        "reply": {
            "text": (msg.get("text") or "")[:TEXT_CAP],
            "reasoning": (msg.get("reasoning") or "")[:TEXT_CAP],
            "tool_calls": [
                {"id": t.get("id"), "name": t.get("name"), "arguments": _clip(t.get("arguments"), TEXT_CAP)}
                for t in msg.get("tool_calls") or []
            ],
        },
        "request_raw": request_raw,
        "response_raw": response_raw,
        "parse_error": parse_error,
    }


_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_image(data: bytes) -> str | None:
    """The media type of a PNG, JPEG, GIF or WebP by its magic bytes (never by what a message says)."""
    for magic, media in _IMAGE_MAGIC:
        if data.startswith(magic):
            return media
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def call_image(
    con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, source: str, seq: int, n: int
) -> tuple[bytes, str]:
    """The ``n``-th inline image of a model call's request, decoded, if it is a real image and small."""
    p = _call_payload(con, run_id, source, seq)
    req, _ = _raw(blobs, p.get("request"))
    if req is None:
        raise NotFound("the call has no request body")
    try:
        _, images = request_messages(p.get("api", ""), loads_untrusted(req))
    except ValueError as e:  # not JSON (or nested past reading): it has no images to show
        raise NotFound(f"the request body is not JSON: {e}") from None
    if not 0 <= n < len(images):
        raise NotFound(f"the request has no image {n}")
    _, _, b64 = images[n].partition(",")
    if len(b64) > IMAGE_CAP * 4 // 3 + 4:
        raise BadRequest(f"image {n} is larger than {IMAGE_CAP} bytes; download the raw request instead")
    try:
        data = base64.b64decode(b64, validate=False)
    except (ValueError, binascii.Error) as e:
        raise BadRequest(f"image {n} is not valid base64: {e}") from None
    media = sniff_image(data)
    if media is None:
        raise BadRequest(f"image {n} is not a PNG, JPEG, GIF or WebP")
    return data, media


# ---------------------------------------------------------------- files, blobs


def file_versions(
    con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, path: str, version: int | None
) -> dict[str, Any]:
    """``GET /api/runs/RUN/files?path=P[&seq=N]``: every version of a file the run wrote, and one
    version's content (text capped, image by blob link, anything else as its size and digest)."""
    rows = con.execute(
        """SELECT seq, ts_ns, op, size, sha256, content_blob FROM file_writes
           WHERE run_id = ? AND path = ? ORDER BY ts_ns, seq""",
        [run_id, path],
    ).fetchall()
    if not rows:
        raise NotFound(f"run {run_id!r} wrote no file {path[:200]!r}")
    versions = [
        {"key": f"shim:{s}", "seq": s, "ts_ns": str(t), "op": op, "size": size, "sha256": sha, "blob": blob}
        for s, t, op, size, sha, blob in rows
    ]
    chosen = versions[-1] if version is None else next((v for v in versions if v["seq"] == version), None)
    if chosen is None:
        raise NotFound(f"no version at seq {version} of {path[:200]!r}")
    content: dict[str, Any] = {"kind": "none"}
    if chosen["blob"]:
        try:
            data = blobs.get(chosen["blob"])
        except BlobError as e:
            content = {"kind": "error", "error": str(e)}
        else:
            media = sniff_image(data)
            if is_volume(path):
                content = {
                    "kind": "volume",
                    "size": len(data),
                    "url": f"/api/runs/{quote(run_id, safe='')}/files/preview?path={quote(path, safe='')}"
                    f"&seq={chosen['seq']}",
                }
            elif media and len(data) <= IMAGE_CAP:
                content = {"kind": "image", "media_type": media, "url": f"/api/blobs/{chosen['blob']}"}
            else:
                try:
                    text = data[:RAW_CAP].decode("utf-8")
                    content = {"kind": "text", "text": text, "truncated": len(data) > RAW_CAP}
                except UnicodeDecodeError:
                    content = {
                        "kind": "binary",
                        "size": len(data),
                        "url": f"/api/blobs/{chosen['blob']}?download=1",
                    }
    # file.written rows carry their source in the key (the shim writes them), except synthetic
    # or imported runs; look the real source up so links land on the event.
    keys = dict(
        con.execute(
            "SELECT seq, source FROM events WHERE run_id = ? AND kind = 'file.written' "
            "AND payload->>'$.path' = ?",
            [run_id, path],
        ).fetchall()
    )
    for v in versions:
        v["key"] = f"{keys.get(v['seq'], 'shim')}:{v['seq']}"
    return {"path": path, "versions": versions, "shown": chosen["seq"], "content": content}


VOLUME_SUFFIXES = (".nii", ".nii.gz", ".npy")
VOLUME_CAP = 256 * 1024 * 1024
"""Largest array (in bytes, once loaded) the preview will read."""
PREVIEW_SIDE = 512


def is_volume(path: str) -> bool:
    return path.lower().endswith(VOLUME_SUFFIXES)


def file_preview(con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, path: str, seq: int) -> bytes:
    """``GET /api/runs/RUN/files/preview?path=P&seq=N``: the middle slice of a NIfTI volume or a
    ``.npy`` array the run wrote, as a PNG (window: 1st to 99th percentile; at most 512 px a side).
    The header is read first and an array above 256 MiB is refused, so a hostile header cannot make
    the viewer allocate what it claims."""
    import io

    import numpy as np
    from PIL import Image

    from replay.arrays import load_nifti, npy_header, read_npy

    row = first(
        con.execute(
            "SELECT content_blob FROM file_writes WHERE run_id = ? AND path = ? AND seq = ?",
            [run_id, path, seq],
        )
    )
    if row is None or not row[0]:
        raise NotFound(f"no stored version at seq {seq} of {path[:200]!r}")
    if not is_volume(path):
        raise BadRequest("previews are for .nii, .nii.gz and .npy files")
    data = blobs.get(row[0])
    # Read as the grader reads submissions (replay.arrays); a size the header claims is refused first.
    f = io.BytesIO(data)
    try:
        if path.lower().endswith(".npy"):
            if npy_header(f).nbytes > VOLUME_CAP:
                raise BadRequest(f"the array is larger than {VOLUME_CAP} bytes")
            arr = read_npy(f)
        else:
            img: Any = load_nifti(f)  # nibabel has no type information
            if int(np.prod(img.shape)) * img.get_data_dtype().itemsize > VOLUME_CAP:
                raise BadRequest(f"the volume is larger than {VOLUME_CAP} bytes")
            arr = np.asanyarray(img.dataobj)
    except BadRequest:
        raise
    except Exception as e:  # a hostile or broken file: any parser error is the file's fault
        raise BadRequest(f"cannot read {path[:200]!r} as an array: {type(e).__name__}: {e}") from None
    arr = np.squeeze(np.asarray(arr))
    while arr.ndim > 2:
        arr = arr[..., arr.shape[-1] // 2]
    if arr.ndim != 2 or arr.size == 0:
        raise BadRequest(f"{path[:200]!r} holds no 2-D slice (shape {arr.shape})")
    values = arr.astype(np.float64)
    finite = values[np.isfinite(values)]
    lo, hi = np.percentile(finite, [1, 99]) if finite.size else (0.0, 1.0)
    scaled = np.clip((np.nan_to_num(values) - lo) / ((hi - lo) or 1.0), 0, 1)
    image = Image.fromarray((scaled.T[::-1] * 255).astype(np.uint8))
    image.thumbnail((PREVIEW_SIDE, PREVIEW_SIDE))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def blob_bytes(blobs: BlobStore, sha: str) -> bytes:
    if not DIGEST_RE.match(sha):
        raise BadRequest("a blob address is sha256: followed by 64 lowercase hex digits")
    try:
        return blobs.get(sha)
    except BlobError as e:
        raise NotFound(str(e)) from None


# ---------------------------------------------------------------- verify, scores


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
    if not has_scores(con):
        return {"scores": [], "reason": "nothing in this store has been scored (amb score)"}
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
    return {"scores": out}


# ---------------------------------------------------------------- timeline


_SPAN_SQL = """
  CASE kind
    WHEN 'model_call.completed' THEN coalesce(nullif((payload->>'$.started_ns')::BIGINT, 0),
        ts_ns - CAST(coalesce((payload->>'$.latency_ms')::DOUBLE, 0) * 1e6 AS BIGINT))
    WHEN 'process.exited' THEN coalesce(nullif((payload->>'$.start_ns')::BIGINT, 0), ts_ns)
    WHEN 'network.request' THEN ts_ns - CAST(coalesce((payload->>'$.duration_ms')::DOUBLE, 0) * 1e6 AS BIGINT)
    ELSE ts_ns END AS s,
  CASE kind
    WHEN 'model_call.completed' THEN coalesce(nullif((payload->>'$.started_ns')::BIGINT, 0), ts_ns)
        + CAST(coalesce((payload->>'$.latency_ms')::DOUBLE, 0) * 1e6 AS BIGINT)
    WHEN 'process.exited' THEN greatest(coalesce((payload->>'$.end_ns')::BIGINT, ts_ns), ts_ns)
    ELSE ts_ns END AS e
"""
"""When each event's activity started and ended: a model call from its start for its latency, a
process from its start to its exit, a network request for its duration; others are instants."""

_LANE_SQL = "CASE kind " + " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in LANES.items()) + " ELSE 'run' END"


def timeline(con: duckdb.DuckDBPyConnection, run_id: str, params: dict[str, str]) -> dict[str, Any]:
    """``GET /api/runs/RUN/timeline``: between ``from_ms`` and ``to_ms``, each event's span on its lane
    with its real duration; when more than ``max`` events fall in the window, their counts per lane
    and bin instead (binned by when they were recorded, which needs no payload parsing)."""
    span = first(con.execute("SELECT min(ts_ns), max(ts_ns) FROM events WHERE run_id = ?", [run_id]))
    if span is None or span[0] is None:
        raise NotFound(f"no run {run_id!r} in the store")
    start_ns, end_ns = int(span[0]), int(span[1])
    f_ms, t_ms = _float(params.get("from_ms"), "from_ms"), _float(params.get("to_ms"), "to_ms")
    a_ns = start_ns + int(f_ms * 1e6) if f_ms is not None else start_ns
    b_ns = start_ns + int(t_ms * 1e6) if t_ms is not None else end_ns
    if b_ns <= a_ns:
        b_ns = a_ns + 1
    cap = _limit(params.get("max"), 1500)
    count = first(
        con.execute(
            "SELECT count(*) FROM events WHERE run_id = ? AND ts_ns BETWEEN ? AND ?", [run_id, a_ns, b_ns]
        )
    )
    n = int(count[0]) if count else 0
    out: dict[str, Any] = {
        "start_ns": str(start_ns),
        "run_from_ms": 0.0,
        "run_to_ms": (end_ns - start_ns) / 1e6,
        "from_ms": (a_ns - start_ns) / 1e6,
        "to_ms": (b_ns - start_ns) / 1e6,
        "count": n,
        "lanes": ["model", "tool", "process", "file", "network", "run"],
    }
    if n <= cap:
        # An event is recorded when its activity ends, so a span reaching into the window from its
        # right is found by looking one window further on.
        rows = con.execute(
            f"""SELECT source, seq, kind, {_LANE_SQL}, * EXCLUDE (source, seq, kind) FROM (
                  SELECT source, seq, kind, {_SPAN_SQL} FROM events
                  WHERE run_id = ? AND ts_ns BETWEEN ? AND ?)
                WHERE e >= ? AND s <= ? ORDER BY s, source, seq LIMIT {cap}""",
            [run_id, a_ns, b_ns + (b_ns - a_ns), a_ns, b_ns],
        ).fetchall()
        out["spans"] = [
            [lane, round((s - start_ns) / 1e6, 3), round((e - s) / 1e6, 3), f"{src}:{seq}", kind]
            for src, seq, kind, lane, s, e in rows
        ]
        return out
    bins = 400
    width = (b_ns - a_ns) / bins
    rows = con.execute(
        f"""SELECT {_LANE_SQL} AS lane,
                   least(CAST(floor((ts_ns - ?) / ?) AS BIGINT), {bins - 1}) AS b, count(*)
            FROM events WHERE run_id = ? AND ts_ns BETWEEN ? AND ? GROUP BY ALL ORDER BY lane, b""",
        [a_ns, width, run_id, a_ns, b_ns],
    ).fetchall()
    out["bins"] = {"n": bins, "width_ms": width / 1e6, "rows": [[lane, b, c] for lane, b, c in rows]}
    return out


# ---------------------------------------------------------------- grid


def grid(index: RunIndex, task: str, profile: str | None) -> dict[str, Any]:
    """``GET /api/grid?task=T``: every run of one task, agents × repeats, with each run's outcome."""
    runs = [r for r in index.rows if r["task"] == task]
    if not runs:
        raise NotFound(f"no runs of task {task!r}")
    profile = profile or (index.profiles[0] if index.profiles else None)
    cells: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: (r["started_ns"] or 0, r["run_id"])):
        agent = r["labels"].get("agent") or r["agent"] or "?"
        name = f"{agent} · {r['model'] or '?'}"
        s = r["scores"].get(profile) if profile else None
        cells.setdefault(name, []).append(
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
        "task": task,
        "profile": profile,
        "rows": [{"agent": k, "runs": v} for k, v in sorted(cells.items())],
        "repeats": max(len(v) for v in cells.values()),
    }
