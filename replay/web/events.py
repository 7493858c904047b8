"""A run's events: pages of one-line rows (``/api/runs/RUN/events``), one event in full
(``/api/runs/RUN/events/SOURCE/SEQ``) and the timeline (``/api/runs/RUN/timeline``): each event's
span on its lane, or counts per lane and bin when a window holds too many.

Events are ordered by ``(ts_ns, source, seq)``; a page can be opened around any event (a deep link)
or any time (a click on the timeline). Rows carry one-line summaries; bodies are fetched on expand, capped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb
import msgspec
from msgspec import UNSET, UnsetType

from replay import search
from replay.store import first
from replay.web.resource import (
    RAW_CAP,
    SUMMARY_CHARS,
    BadRequest,
    Limit,
    Millis,
    NotFound,
    Query,
    decode_cursor,
    encode_cursor,
    one_line,
    parse_key,
)
from schemas.untrusted_json import loads_untrusted

PAYLOAD_CAP = 64 * 1024
"""Payloads up to this size are summarised from their JSON; a bigger one by its first characters."""

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


def summarize_event(kind: str, p: dict[str, Any]) -> tuple[str, float | None, bool, list[int] | None]:
    """One line for the event list, its duration, whether it failed, and (model calls) its tokens
    (in Python: the same CASE over JSON paths in SQL costs DuckDB long planning per query)."""

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


class EventsQuery(Query, frozen=True):
    limit: Limit = 100
    kinds: str = ""
    hide: str = ""
    q: str = ""
    around: str | None = None
    at_ms: Millis | None = None
    after: str | None = None
    before: str | None = None


class EventRow(msgspec.Struct, omit_defaults=True):
    key: str
    source: str
    seq: int
    ts_ns: str
    t_ms: float
    kind: str
    lane: str
    summary: str
    dur_ms: float | None = None
    flagged: bool = False
    tokens: list[int] | None = None


class EventsPage(msgspec.Struct):
    events: list[EventRow]
    next: str | None
    prev: str | None
    start_ns: str
    target: str | None = None


class EventDetail(msgspec.Struct):
    key: str
    source: str
    seq: int
    kind: str
    v: int
    ts_ns: str
    payload: Any
    payload_bytes: int
    prev_hash: str | None
    hash: str


def _parsed(text: str | None, otherwise: Any) -> Any:
    """A stored payload decoded, or ``otherwise`` when it is not given (too big) or nests deeper than
    any decoder reads (only a hostile spool holds one)."""
    if text is None:
        return otherwise
    try:
        return loads_untrusted(text)
    except ValueError:
        return otherwise


def _malformed(kind: str, payload: Any) -> str:
    """The line of an event whose payload is not what its kind says (only a hostile spool holds one)."""
    return f"malformed {kind} payload: {json.dumps(payload)[:SUMMARY_CHARS]}"


def _event_row(source: str, seq: int, ts_ns: int, kind: str, payload: Any, start_ns: int) -> EventRow:
    if isinstance(payload, dict):
        try:
            summary, dur_ms, flagged, tokens = summarize_event(kind, payload)
        except (TypeError, AttributeError, ValueError):  # a field of another type than its kind's
            summary, dur_ms, flagged, tokens = _malformed(kind, payload), None, True, None
        if tokens is not None and not all(type(t) is int for t in tokens):
            tokens = None
    elif isinstance(payload, str):  # too big to parse for one line: its first characters
        summary, dur_ms, flagged, tokens = payload, None, False, None
    else:  # no object at all
        summary, dur_ms, flagged, tokens = _malformed(kind, payload), None, True, None
    return EventRow(
        f"{source}:{seq}",
        source,
        seq,
        str(ts_ns),
        round((ts_ns - start_ns) / 1e6, 3),
        kind,
        LANES.get(kind, "run"),
        one_line(summary),
        None if dur_ms is None else round(dur_ms, 3),
        flagged,
        tokens,
    )


Mark = tuple[int, str, int]
"""A position in the run's order: ``(ts_ns, source, seq)``."""


@dataclass
class _Keys:
    """Finds the keys of the events after or before a mark, under the page's filters."""

    con: duckdb.DuckDBPyConnection
    base: str
    args: list[Any]
    spacing_ns: float | None
    """The run's mean time between events, when nothing filters them (else None)."""

    def top(self, mark: Mark, forward: bool, n: int, bound: int | None) -> list[Any]:
        order, op, far = ("ASC", ">=", "<=") if forward else ("DESC", "<=", ">=")
        within = f"AND ts_ns {far} ?" if bound is not None else ""
        return self.con.execute(
            f"{self.base} AND ts_ns {op} ? {within} "
            f"ORDER BY ts_ns {order}, source {order}, seq {order} LIMIT {n}",
            [*self.args, mark[0], *([] if bound is None else [bound])],
        ).fetchall()

    def __call__(self, mark: Mark, forward: bool, inclusive: bool, n: int) -> list[tuple[str, int]]:
        # Keys first (a top-N on the run's ordering), summaries second, for those rows only. The
        # SQL bound is on ts_ns alone (a plain range DuckDB can prune storage blocks with); rows
        # tied on ts_ns are put in order here, and the full keyset condition is used only when
        # more than a few of them share the mark's time.
        slack = 32
        rows = None
        if self.spacing_ns:
            # A top-N from the mark to the run's end reads every row in between. Asked first within
            # a window that should hold four times the rows wanted at the run's mean rate: when it
            # holds enough, they are the same first rows (every row past the window sorts after
            # every row in it); else the whole rest.
            reach = int(self.spacing_ns * (n + slack) * 4) + 1
            rows = self.top(mark, forward, n + slack, mark[0] + (reach if forward else -reach))
            if len(rows) < n + slack:
                rows = None
        if rows is None:
            rows = self.top(mark, forward, n + slack, None)
        if forward:
            keep = [(s, q) for s, q, ts in rows if (ts, s, q) > mark or (inclusive and (ts, s, q) == mark)]
        else:
            keep = [(s, q) for s, q, ts in rows if (ts, s, q) < mark]
        if len(rows) == n + slack and len(keep) < n:
            keep = self.exact(mark, forward, inclusive, n)
        return keep[:n]

    def exact(self, mark: Mark, forward: bool, inclusive: bool, n: int) -> list[tuple[str, int]]:
        """The full keyset condition, for marks whose time many rows share."""
        if forward:
            op, order = (">=" if inclusive else ">"), "ASC"
            cond = f"(ts_ns > ? OR (ts_ns = ? AND (source > ? OR (source = ? AND seq {op} ?))))"
        else:
            order = "DESC"
            cond = "(ts_ns < ? OR (ts_ns = ? AND (source < ? OR (source = ? AND seq < ?))))"
        rows = self.con.execute(
            f"{self.base} AND {cond} ORDER BY ts_ns {order}, source {order}, seq {order} LIMIT {n}",
            [*self.args, mark[0], mark[0], mark[1], mark[1], mark[2]],
        ).fetchall()
        return [(src, seq) for src, seq, _ in rows]


def _finder(con: duckdb.DuckDBPyConnection, run_id: str, q: EventsQuery, spacing_ns: float | None) -> _Keys:
    where = ["run_id = ?"]
    args: list[Any] = [run_id]
    for names, op in ((q.kinds, "IN"), (q.hide, "NOT IN")):
        kinds = [k for k in names.split(",") if k]
        if kinds:
            where.append(f"kind {op} ({', '.join('?' for _ in kinds)})")
            args += kinds
    if q.q:
        condition, arg = search.matches(con, q.q)
        where.append(condition)
        args.append(arg)
    base = "SELECT source, seq, ts_ns FROM events WHERE " + " AND ".join(where)
    return _Keys(con, base, args, None if q.kinds or q.q else spacing_ns)


def events_page(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    q: EventsQuery,
    start_ns: int | None = None,
    spacing_ns: float | None = None,
) -> EventsPage:
    """``GET /api/runs/RUN/events``: one page, opened ``around`` an event (``SOURCE:SEQ``) or a time
    (``at_ms`` from the run's start), or continued ``after``/``before`` a cursor. ``start_ns``: the
    run's first event time, and ``spacing_ns``, the mean time between its events, when the caller
    knows them (the run index does)."""
    if start_ns is None:
        row = first(con.execute("SELECT min(ts_ns) FROM events WHERE run_id = ?", [run_id]))
        if row is None or row[0] is None:
            raise NotFound(f"no run {run_id!r} in the store")
        start_ns = int(row[0])
    keys = _finder(con, run_id, q, spacing_ns)
    target = None
    if q.after or q.before:
        cursor = decode_cursor(q.after or q.before or "")
        if not (isinstance(cursor, list) and len(cursor) == 3):
            raise BadRequest("bad events cursor")
        forward = bool(q.after)
        got = keys((int(cursor[0]), str(cursor[1]), int(cursor[2])), forward, False, q.limit + 1)
        more = len(got) > q.limit
        after, before = (got[: q.limit], []) if forward else ([], got[: q.limit])
        more_after, more_before = more and forward, more and not forward
    else:
        target, mark = _opening(con, run_id, q, start_ns)
        # Opened at the run's start nothing comes before: the whole page follows, and no query for it.
        half = max(q.limit // 2, 1) if mark[0] >= start_ns else 0
        after = keys(mark, True, True, q.limit - half + 1)
        before = keys(mark, False, False, half + 1) if half else []
        more_after, more_before = len(after) > q.limit - half, len(before) > half
        after, before = after[: q.limit - half], before[:half]
    before.reverse()
    rows = _summaries(con, run_id, before + after, start_ns)
    return EventsPage(
        rows,
        _cursor(rows[-1]) if more_after and rows else None,
        _cursor(rows[0]) if more_before and rows else None,
        str(start_ns),
        target,
    )


def _opening(
    con: duckdb.DuckDBPyConnection, run_id: str, q: EventsQuery, start_ns: int
) -> tuple[str | None, Mark]:
    """Where a fresh page opens: at the event asked for (its key is the target), a time, or the start."""
    if q.around:
        source, seq = parse_key(q.around)
        hit = first(
            con.execute(
                "SELECT ts_ns FROM events WHERE run_id = ? AND source = ? AND seq = ?", [run_id, source, seq]
            )
        )
        if hit is None:
            raise NotFound(f"no event {source}:{seq} in run {run_id!r}")
        return f"{source}:{seq}", (int(hit[0]), source, seq)
    if q.at_ms is not None:
        return None, (start_ns + int(q.at_ms * 1e6), "", -1)
    return None, (start_ns - 1, "", -1)


def _summaries(
    con: duckdb.DuckDBPyConnection, run_id: str, keys: list[tuple[str, int]], start_ns: int
) -> list[EventRow]:
    """The list rows of ``keys``, in the order given."""
    if not keys:
        return []
    by_source: dict[str, list[int]] = {}
    for src, seq in keys:
        by_source.setdefault(src, []).append(seq)
    # Per source, a seq range (DuckDB skips storage blocks by their min/max) and the seqs themselves,
    # one SELECT each: conditions joined by OR are not pushed into the scan (which would read the
    # payload of every event of the run), nor is a range alone enough for scattered keys.
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
        (src, seq): _event_row(src, seq, ts, kind, _parsed(full, prefix), start_ns)
        for src, seq, ts, kind, full, prefix in rows
        if (src, seq) in wanted
    }
    return [found[k] for k in keys if k in found]


def _cursor(row: EventRow) -> str:
    return encode_cursor([row.ts_ns, row.source, row.seq])


def event_detail(con: duckdb.DuckDBPyConnection, run_id: str, source: str, seq: int) -> EventDetail:
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
    body = _parsed(payload if size <= 4 * RAW_CAP else None, {"_truncated": payload[: 4 * RAW_CAP]})
    return EventDetail(f"{source}:{seq}", source, seq, kind, v, str(ts_ns), body, size, prev_hash, hash_)


def _ns_moved(base: str, ms_field: str, sign: str) -> str:
    """``base`` (ns) moved by the payload's milliseconds field, in exact integers; ``base`` itself
    where the field is no number or the sum leaves BIGINT's range (only a hostile spool holds such
    a value, and the span is then an instant)."""
    ms = f"coalesce(TRY_CAST(TRY_CAST(payload->>'$.{ms_field}' AS DOUBLE) * 1e6 AS BIGINT), 0)"
    return f"coalesce(TRY_CAST(CAST({base} AS HUGEINT) {sign} {ms} AS BIGINT), {base})"


_CALL_START = "coalesce(nullif(TRY_CAST(payload->>'$.started_ns' AS BIGINT), 0), {otherwise})"

_CALL_FROM = _CALL_START.format(otherwise=_ns_moved("ts_ns", "latency_ms", "-"))
_CALL_TO = _ns_moved(_CALL_START.format(otherwise="ts_ns"), "latency_ms", "+")
_REQUEST_FROM = _ns_moved("ts_ns", "duration_ms", "-")

_SPAN_SQL = f"""
  CASE kind
    WHEN 'model_call.completed' THEN {_CALL_FROM}
    WHEN 'process.exited' THEN coalesce(nullif(TRY_CAST(payload->>'$.start_ns' AS BIGINT), 0), ts_ns)
    WHEN 'network.request' THEN {_REQUEST_FROM}
    ELSE ts_ns END AS s,
  CASE kind
    WHEN 'model_call.completed' THEN {_CALL_TO}
    WHEN 'process.exited' THEN greatest(coalesce(TRY_CAST(payload->>'$.end_ns' AS BIGINT), ts_ns), ts_ns)
    ELSE ts_ns END AS e
"""
"""When each event's activity started and ended: a model call from its start for its latency, a
process from its start to its exit, a network request for its duration; others are instants."""

_LANE_SQL = "CASE kind " + " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in LANES.items()) + " ELSE 'run' END"
BINS = 400


class TimelineQuery(Query, frozen=True):
    from_ms: Millis | None = None
    to_ms: Millis | None = None
    max: Limit = 1500
    """Above this many events in the window, counts per bin instead of spans."""


class Bins(msgspec.Struct):
    n: int
    width_ms: float
    rows: list[tuple[str, int, int]]
    """[lane, bin, count]"""


class Timeline(msgspec.Struct):
    """``GET /api/runs/RUN/timeline``: between ``from_ms`` and ``to_ms``, each event's span on its lane
    with its real duration; when more than ``max`` events fall in the window, their counts per lane
    and bin instead (binned by when they were recorded, which needs no payload parsing)."""

    start_ns: str
    run_from_ms: float
    run_to_ms: float
    from_ms: float
    to_ms: float
    count: int
    lanes: list[str]
    spans: list[tuple[str, float, float, str, str]] | UnsetType = UNSET
    """[lane, start_ms, duration_ms, key, kind]"""
    bins: Bins | UnsetType = UNSET


def timeline(
    con: duckdb.DuckDBPyConnection, run_id: str, q: TimelineQuery, start_ns: int, end_ns: int
) -> Timeline:
    """``start_ns``, ``end_ns``: the times of the run's first and last events."""
    a_ns = start_ns + int(q.from_ms * 1e6) if q.from_ms is not None else start_ns
    b_ns = start_ns + int(q.to_ms * 1e6) if q.to_ms is not None else end_ns
    b_ns = max(b_ns, a_ns + 1)
    count = first(
        con.execute(
            "SELECT count(*) FROM events WHERE run_id = ? AND ts_ns BETWEEN ? AND ?", [run_id, a_ns, b_ns]
        )
    )
    n = int(count[0]) if count else 0
    out = Timeline(
        str(start_ns),
        0.0,
        (end_ns - start_ns) / 1e6,
        (a_ns - start_ns) / 1e6,
        (b_ns - start_ns) / 1e6,
        n,
        [*dict.fromkeys(LANES.values()), "run"],
    )
    if n <= q.max:
        # An event is recorded when its activity ends, so a span reaching into the window from its
        # right is found by looking one window further on.
        rows = con.execute(
            f"""SELECT source, seq, kind, {_LANE_SQL}, * EXCLUDE (source, seq, kind) FROM (
                  SELECT source, seq, kind, {_SPAN_SQL} FROM events
                  WHERE run_id = ? AND ts_ns BETWEEN ? AND ?)
                WHERE e >= ? AND s <= ? ORDER BY s, source, seq LIMIT {q.max}""",
            [run_id, a_ns, b_ns + (b_ns - a_ns), a_ns, b_ns],
        ).fetchall()
        out.spans = [
            (lane, round((s - start_ns) / 1e6, 3), round((e - s) / 1e6, 3), f"{src}:{seq}", kind)
            for src, seq, kind, lane, s, e in rows
        ]
        return out
    width = (b_ns - a_ns) / BINS
    rows = con.execute(
        f"""SELECT {_LANE_SQL} AS lane,
                   least(CAST(floor((ts_ns - ?) / ?) AS BIGINT), {BINS - 1}) AS b, count(*)
            FROM events WHERE run_id = ? AND ts_ns BETWEEN ? AND ? GROUP BY ALL ORDER BY lane, b""",
        [a_ns, width, run_id, a_ns, b_ns],
    ).fetchall()
    out.bins = Bins(BINS, width / 1e6, rows)
    return out
