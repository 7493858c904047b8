"""A run's summary (what ran, how it ended, what it used), read from the store by five plain scans
(``summaries``: ``amb runs``, ``amb show``, the viewer) or folded from events as they are read
(``RunSummary.add``: ``amb watch``); a test holds both to the same summary of the same events. A
cost nobody priced is unknown (None), never 0."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import duckdb
import msgspec

from schemas.codec import Event
from schemas.errors import NotFound
from schemas.events import ModelCallCompleted, RunFinished, RunStarted, Usage
from schemas.untrusted_json import check_json_depth

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


_COUNTS = """SELECT run_id, count(*), min(ts_ns), max(ts_ns),
       count(*) FILTER (WHERE kind = 'model_call.completed'),
       count(*) FILTER (WHERE kind = 'tool_call.requested'),
       count(*) FILTER (WHERE kind = 'process.exited'),
       count(*) FILTER (WHERE kind = 'file.written')
FROM events {where} GROUP BY run_id"""
_CALLS = """SELECT run_id, count(*) FILTER (WHERE NOT ok),
       sum(input_tokens)::BIGINT, sum(cache_read_tokens)::BIGINT, sum(cache_write_tokens)::BIGINT,
       sum(output_tokens)::BIGINT, sum(reasoning_tokens)::BIGINT
FROM model_calls {where} GROUP BY run_id"""
_MODELS = "SELECT DISTINCT run_id, model FROM model_calls {where} {also} model <> ''"
"""(Apart from the sums: a DISTINCT list per run in the same aggregate holds a hash set per run.)"""
_ENDS = "SELECT run_id, ts_ns, CAST(payload AS VARCHAR) FROM events WHERE kind = $kind {also}"
"""(One kind at a time: with ``kind IN (...)`` DuckDB filters after the scan, and reads the payload
of every event instead of the run's two.)"""


class _Ends(msgspec.Struct):
    """The fields of run.started and run.finished payloads a summary shows, as the JSON has them."""

    task: Any = None
    tier: Any = None
    agent: Any = None
    model: Any = None
    backend: Any = None
    labels: Any = None
    status: Any = None
    exit_code: Any = None
    duration_s: Any = None


def summaries(con: duckdb.DuckDBPyConnection, run_id: str | None = None) -> list[RunSummary]:
    """Every run's summary (or only ``run_id``'s), ordered by start (runs that never started last),
    then id: five plain scans folded here, each keeping a row per run (a join of the ``runs`` view
    to the calls' aggregate builds hash tables as big as the store)."""
    where, params = ("WHERE run_id = $run", {"run": run_id}) if run_id is not None else ("", {})
    found: dict[str, RunSummary] = {}
    for run, n, first_ns, last_ns, calls, tools, processes, writes in con.execute(
        _COUNTS.format(where=where), params
    ).fetchall():
        found[run] = RunSummary(
            run_id=run, events=n, first_ns=first_ns, last_ns=last_ns, model_calls=calls,
            tool_calls=tools, processes=processes, file_writes=writes,
        )  # fmt: skip
    for run, failed, *tokens in con.execute(_CALLS.format(where=where), params).fetchall():
        if (s := found.get(run)) is not None:
            s.failed_calls = failed
            s.tokens = Tokens(**{f: t or 0 for f, t in zip(Tokens.__struct_fields__, tokens, strict=True)})
    models = _MODELS.format(where=where, also="AND" if where else "WHERE")
    for run, model in con.execute(models, params).fetchall():
        if (s := found.get(run)) is not None:
            s.models.append(model)
    for s in found.values():
        s.models.sort()
    ends = _ends_of(con, "AND run_id = $run" if run_id is not None else "", params)
    for run, ts_ns, p in ends("run.started"):
        if (s := found.get(run)) is not None:
            s.task, s.tier, s.agent, s.model = _text(p.task), _text(p.tier), _text(p.agent), _text(p.model)
            s.backend, s.labels, s.started_ns = _text(p.backend), labels_of(p.labels), ts_ns
    for run, _, p in ends("run.finished"):
        if (s := found.get(run)) is not None:
            s.status = _text(p.status) or UNFINISHED
            s.exit_code, s.duration_s = _number(p.exit_code, int), _number(p.duration_s, float)
    return sorted(found.values(), key=lambda s: (s.started_ns is None, s.started_ns or 0, s.run_id))


def _ends_of(
    con: duckdb.DuckDBPyConnection, also: str, params: dict[str, Any]
) -> Callable[[str], Iterator[tuple[str, int, _Ends]]]:
    """The events of one kind, each with its payload's fields (none of a payload nested deeper than
    any real one, which no decoder reads without running out of stack)."""
    decode = msgspec.json.Decoder(_Ends).decode

    def ends(kind: str) -> Iterator[tuple[str, int, _Ends]]:
        for run, ts_ns, payload in con.execute(_ENDS.format(also=also), {"kind": kind, **params}).fetchall():
            try:
                check_json_depth(payload)
            except ValueError:
                yield run, ts_ns, _Ends()
                continue
            try:
                yield run, ts_ns, decode(payload)
            except msgspec.ValidationError:
                yield run, ts_ns, _leniently(payload)

    return ends


def _leniently(payload: str) -> _Ends:
    """The fields of a payload msgspec refuses: one that is no object (none), or one holding a number
    out of any range (``1e400``, which Python reads as infinity). Only a hostile spool holds one,
    and the run is still summarised with every field that can be read."""
    value = json.loads(payload)
    if not isinstance(value, dict):
        return _Ends()
    return _Ends(**{name: value.get(name) for name in _Ends.__struct_fields__})


def _text(value: Any) -> str | None:
    """A JSON value as text, as DuckDB's ``->>`` gives it (null stays None)."""
    return value if isinstance(value, str) or value is None else json.dumps(value, separators=(",", ":"))


def _number(value: Any, kind: type[int] | type[float]) -> Any:
    """A JSON number as the summary's type, as the views' TRY_CAST reads it: None when it is no
    number, not finite, or (an integer) outside BIGINT's range."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or (kind is int and not -(2**63) <= value < 2**63):
        return None
    return kind(value)


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
