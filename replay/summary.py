"""A run's summary (what ran, how it ended, what it used), read from the store by one query
(``summaries``: ``amb runs``, ``amb show``, the viewer) or folded from events as they are read
(``RunSummary.add``: ``amb watch``); a test holds both to the same summary of the same events. A
cost nobody priced is unknown (None), never 0."""

from __future__ import annotations

import json
from typing import Any

import duckdb
import msgspec

from schemas.codec import Event
from schemas.errors import NotFound
from schemas.events import ModelCallCompleted, RunFinished, RunStarted, Usage

UNFINISHED = "unfinished"
"""The status of a run with no ``run.finished`` (the ``runs`` view's word)."""

HEADER = ("run_id", "task", "tier", "agent", "model", "backend", "status", "exit_code")

_COUNTED = {"tool_call.requested": "tool_calls", "process.exited": "processes", "file.written": "file_writes"}


class Tokens(msgspec.Struct, kw_only=True):
    """What model calls used, summed (each call's ``schemas.events.Usage``)."""

    input: int = 0
    """Cached input included."""
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    """Reasoning included."""
    reasoning: int = 0

    def add(self, u: Usage) -> None:
        self.input, self.cache_read = self.input + u.input_total, self.cache_read + u.cache_read
        self.cache_write, self.output = self.cache_write + u.cache_write, self.output + u.output
        self.reasoning += u.reasoning

    def shown(self) -> dict[str, int]:
        """The figures ``amb show`` and ``amb watch`` print (cache writes are part of the input)."""
        return {name: getattr(self, name) for name in ("input", "cache_read", "output", "reasoning")}


class RunSummary(msgspec.Struct, kw_only=True):
    run_id: str
    status: str = UNFINISHED
    task: str | None = None
    tier: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    agent: str | None = None
    model: str | None = None
    """The model named when the run started (``models``: what its calls were served by)."""
    events: int = 0
    backend: str | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    model_calls: int = 0
    started_ns: int | None = None
    first_ns: int | None = None
    last_ns: int | None = None
    """The earliest and latest time of any of its events."""
    failed_calls: int = 0
    models: list[str] = msgspec.field(default_factory=list)
    tokens: Tokens = msgspec.field(default_factory=Tokens)
    tool_calls: int = 0
    """Tool calls the model asked for (``processes``: processes that exited)."""
    processes: int = 0
    file_writes: int = 0
    cost_usd: float | None = None
    """USD, rounded as ``amb score`` rounds; None: unknown (not priced, or a call had no price)."""

    def header(self) -> dict[str, Any]:
        """What ran and how it ended, as JSON's first fields (``amb show --json``, the viewer's rows)."""
        return {name: getattr(self, name) for name in HEADER}

    def add(self, ev: Event) -> None:
        """Fold one more event of the run into the summary (any order across sources)."""
        self.events += 1
        self.first_ns = ev.ts_ns if self.first_ns is None else min(self.first_ns, ev.ts_ns)
        self.last_ns = ev.ts_ns if self.last_ns is None else max(self.last_ns, ev.ts_ns)
        p = ev.payload
        if isinstance(p, ModelCallCompleted):
            self.model_calls += 1
            self.failed_calls += not p.ok
            self.tokens.add(p.usage)
            if p.model and p.model not in self.models:
                self.models = sorted([*self.models, p.model])
        elif isinstance(p, RunStarted):
            self.task, self.tier, self.agent, self.model = p.task, p.tier, p.agent, p.model
            self.backend, self.labels, self.started_ns = p.backend, dict(p.labels), ev.ts_ns
        elif isinstance(p, RunFinished):
            self.status, self.exit_code, self.duration_s = p.status, p.exit_code, p.duration_s
        elif ev.kind in _COUNTED:
            name = _COUNTED[ev.kind]
            setattr(self, name, getattr(self, name) + 1)


_SUMMARIES = """
SELECT r.run_id, r.task, r.tier, r.agent, r.model, r.backend, CAST(r.labels AS VARCHAR) AS labels,
       r.status, r.exit_code, r.duration_s, r.started_ns, e.first_ns, e.last_ns, r.n_events AS events,
       r.n_model_calls AS model_calls, coalesce(m.failed, 0) AS failed_calls,
       list_sort(coalesce(m.models, [])) AS models,
       struct_pack(input := coalesce(m.input, 0), cache_read := coalesce(m.cache_read, 0),
                   cache_write := coalesce(m.cache_write, 0), output := coalesce(m.output, 0),
                   reasoning := coalesce(m.reasoning, 0)) AS tokens,
       r.n_tool_calls AS tool_calls, r.n_processes AS processes, r.n_file_writes AS file_writes
FROM runs r
LEFT JOIN (
    SELECT run_id, count(*) FILTER (WHERE NOT ok) AS failed,
           list(DISTINCT model) FILTER (model <> '') AS models,
           sum(input_tokens)::BIGINT AS input, sum(cache_read_tokens)::BIGINT AS cache_read,
           sum(cache_write_tokens)::BIGINT AS cache_write, sum(output_tokens)::BIGINT AS output,
           sum(reasoning_tokens)::BIGINT AS reasoning
    FROM model_calls {where} GROUP BY run_id
) m USING (run_id)
LEFT JOIN (SELECT run_id, min(ts_ns) AS first_ns, max(ts_ns) AS last_ns FROM events {where} GROUP BY run_id) e
    USING (run_id)
{where_r}
ORDER BY r.started_ns NULLS LAST, r.run_id
"""


def summaries(con: duckdb.DuckDBPyConnection, run_id: str | None = None) -> list[RunSummary]:
    """Every run's summary (or only ``run_id``'s), ordered by start (runs that never started last),
    then id."""
    where = ("WHERE run_id = $run", "WHERE r.run_id = $run") if run_id is not None else ("", "")
    cur = con.execute(_SUMMARIES.format(where=where[0], where_r=where[1]), {"run": run_id} if run_id else {})
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    for fields in rows:
        fields["labels"] = labels_of(json.loads(fields["labels"] or "{}"))
    return msgspec.convert(rows, list[RunSummary])


def labels_of(value: Any) -> dict[str, str]:
    """A run.started payload's labels as text: the recorder writes strings, and a hostile spool's
    other values are shown as their JSON, never dropped (and no object at all is no labels)."""
    if not isinstance(value, dict):
        return {}
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


def summary(con: duckdb.DuckDBPyConnection, run_id: str) -> RunSummary:
    """One run's summary; ``NotFound`` when the store has no such run."""
    found = summaries(con, run_id)
    if not found:
        raise NotFound(f"no run {run_id!r} in the store (see `amb runs`)")
    return found[0]
