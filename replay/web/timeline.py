"""A run's timeline (``/api/runs/RUN/timeline``): each event's span on its lane, or counts per
lane and bin when a window holds too many."""

from __future__ import annotations

from typing import Any

import duckdb

from replay.store import first
from replay.web.events import LANES
from replay.web.resource import Limit, Millis, NotFound, Query

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


class TimelineQuery(Query, frozen=True):
    from_ms: Millis | None = None
    to_ms: Millis | None = None
    max: Limit = 1500
    """Above this many events in the window, counts per bin instead of spans."""


def timeline(con: duckdb.DuckDBPyConnection, run_id: str, q: TimelineQuery) -> dict[str, Any]:
    """``GET /api/runs/RUN/timeline``: between ``from_ms`` and ``to_ms``, each event's span on its lane
    with its real duration; when more than ``max`` events fall in the window, their counts per lane
    and bin instead (binned by when they were recorded, which needs no payload parsing)."""
    span = first(con.execute("SELECT min(ts_ns), max(ts_ns) FROM events WHERE run_id = ?", [run_id]))
    if span is None or span[0] is None:
        raise NotFound(f"no run {run_id!r} in the store")
    start_ns, end_ns = int(span[0]), int(span[1])
    f_ms, t_ms = q.from_ms, q.to_ms
    a_ns = start_ns + int(f_ms * 1e6) if f_ms is not None else start_ns
    b_ns = start_ns + int(t_ms * 1e6) if t_ms is not None else end_ns
    if b_ns <= a_ns:
        b_ns = a_ns + 1
    cap = q.max
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
