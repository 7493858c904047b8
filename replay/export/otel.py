"""A stored run as OpenTelemetry spans: OTLP JSON lines (the OTLP file exporter's format), one line
(one ``TracesData``) per run, with GenAI semantic-convention attributes pinned to **1.44.0**
(``SCHEMA_URL``, also ``amb.semconv.genai`` on the resource).

Spans: the root ``invoke_agent``, one per model call, tool call, process and network request; file
changes, the submission and notes are events on the root (docs/interop.md has the table). Trace and
span ids are sha256 prefixes of the run id and of ``run|source|seq``, so re-exports are identical.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable
from typing import Any, TextIO
from urllib.parse import urlsplit

from replay.export import BlobReader
from schemas import providers
from schemas.codec import Event, escape_line_ends
from schemas.errors import BlobError
from schemas.events import (
    UNKNOWN_ENDING,
    FileAccessed,
    FileDeleted,
    FileRenamed,
    FileWritten,
    ModelCallCompleted,
    NetworkRequest,
    Note,
    Payload,
    ProcessExited,
    RunFinished,
    RunStarted,
    SubmissionSealed,
    ToolCallRequested,
    ToolCallResult,
)
from schemas.providers import render
from schemas.untrusted_json import loads_untrusted

SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SCOPE = "amb-recorder"

INTERNAL, CLIENT = 1, 3
UNSET, ERROR = 0, 2


def trace_id(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()[:32]


def span_id(run_id: str, source: str, seq: int) -> str:
    return hashlib.sha256(f"{run_id}|{source}|{seq}".encode()).hexdigest()[:16]


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list | tuple):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def attrs(pairs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in pairs.items() if v is not None]


def _span(
    run_id: str,
    e: Event,
    name: str,
    kind: int,
    start: int,
    end: int,
    attributes: dict[str, Any],
    error: str | None,
) -> dict[str, Any]:
    """A span without its parent (a child's is appended once the root is known)."""
    return {
        "traceId": trace_id(run_id),
        "spanId": span_id(run_id, e.source, e.seq),
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(max(end, start)),
        "attributes": attrs(attributes),
        "status": {"code": ERROR, "message": error} if error else {"code": UNSET},
    }


def messages(p: ModelCallCompleted, read_blob: BlobReader) -> dict[str, Any]:
    """A model call's conversation and answer as the GenAI conventions' message attributes (the
    input left out when its request body cannot be read)."""
    out: dict[str, Any] = {
        "gen_ai.output.messages": _json(render.semconv_reply(p.message, p.stop_reason)),
    }
    try:
        body = loads_untrusted(read_blob(p.request)) if p.request is not None else None
    except (BlobError, ValueError):
        return out
    conv = providers.conversation(p.api, body)
    system = conv.system()
    if system is not None:
        out["gen_ai.system_instructions"] = _json([{"type": "text", "content": system}])
    out["gen_ai.input.messages"] = _json(render.semconv(conv.rest()))
    return out


def _json(value: Any) -> str:
    """Compact JSON, the line ends ``str.splitlines()`` splits at escaped (the line stays one line)."""
    return escape_line_ends(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _call_attrs(p: ModelCallCompleted, run_id: str) -> dict[str, Any]:
    """A model call's span attributes, the GenAI conventions' names first."""
    url = urlsplit(p.url) if p.url else None
    u = p.usage
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": p.provider,
        "gen_ai.conversation.id": run_id,
        "gen_ai.request.model": p.model,
        "gen_ai.request.stream": True if p.stream else None,
        "gen_ai.response.finish_reasons": [p.stop_reason] if p.stop_reason else None,
        "gen_ai.usage.input_tokens": u.input_total,
        "gen_ai.usage.output_tokens": u.output,
        "gen_ai.usage.cache_read.input_tokens": u.cache_read,
        "gen_ai.usage.cache_creation.input_tokens": u.cache_write,
        "gen_ai.usage.reasoning.output_tokens": u.reasoning,
        "gen_ai.response.time_to_first_chunk": p.ttfb_ms / 1000 if p.ttfb_ms is not None else None,
        "server.address": url.hostname if url and url.hostname else None,
        "server.port": url.port or (443 if url.scheme == "https" else 80) if url and url.hostname else None,
        "amb.call_id": p.call_id,
        "amb.usage_reported": u.reported,
        "amb.partial": True if p.partial else None,
        "amb.timing": "unknown" if p.latency_ms is None else None,
    }


def _root_event_attrs(p: Payload) -> dict[str, Any]:
    """What a file change, the sealed submission or a note says as an event on the root span."""
    if isinstance(p, FileWritten):
        return {"amb.path": p.path, "amb.size": p.size, "amb.sha256": p.sha256}
    if isinstance(p, FileDeleted | FileAccessed):
        return {"amb.path": p.path}
    if isinstance(p, FileRenamed):
        return {"amb.path": p.dst, "amb.src": p.src}
    if isinstance(p, SubmissionSealed):
        return {"amb.files": len(p.files)}
    assert isinstance(p, Note)
    return {"amb.note": p.text[:4096], "amb.note_kind": str(p.data.get("kind", ""))}


ROOT_EVENTS = (FileWritten, FileDeleted, FileAccessed, FileRenamed, SubmissionSealed, Note)
"""Payloads that become events on the root span rather than spans of their own."""


class _Spans:
    """The spans of one run under its root, built event by event: a tool call's span waits for
    its result, and ends when the model call that carried the result started.

    Each span and root event is kept encoded, its root's span id left out (the root is known once
    every event was seen): a run of a million events holds its output, not a million objects."""

    def __init__(self, read_blob: BlobReader | None):
        self.run_id, self.read_blob = "", read_blob
        self.spans: list[str] = []
        """Each child span's JSON without its closing brace (``parentSpanId`` comes last)."""
        self.root_events: list[str] = []
        self.asked: dict[str, tuple[Event, ToolCallRequested]] = {}
        self.calls_started: dict[str, int] = {}
        self.start_ev: Event | None = None
        self.finish_ev: Event | None = None
        self.first_ev: Event | None = None
        self.last_ev: Event | None = None

    def child(
        self, e: Event, name: str, kind: int, start: int, end: int, a: dict[str, Any], error: str | None
    ) -> None:
        self.spans.append(_json(_span(self.run_id, e, name, kind, start, end, a, error))[:-1])

    def see(self, e: Event) -> None:
        """One event, in ``replay.read.iter_events``' order (time, then source and seq)."""
        if self.first_ev is None:
            self.first_ev, self.run_id = e, e.run_id
        self.last_ev = e
        if self.start_ev is None and isinstance(e.payload, RunStarted):
            self.start_ev = e
        if self.finish_ev is None and isinstance(e.payload, RunFinished):
            self.finish_ev = e
        p: Payload = e.payload
        if isinstance(p, ModelCallCompleted):
            self.model_call(e, p)
        elif isinstance(p, ToolCallRequested):
            self.asked[p.tool_call_id] = (e, p)
        elif isinstance(p, ToolCallResult):
            self.tool_result(e, p)
        elif isinstance(p, ProcessExited):
            self.process(e, p)
        elif isinstance(p, NetworkRequest):
            begin = p.started_ns or e.ts_ns
            end = begin + int(p.duration_ms * 1e6) if p.duration_ms is not None else begin
            a = {
                "http.request.method": p.method or None,
                "server.address": p.host or None,
                "server.port": p.port,
                "url.scheme": p.scheme or None,
                "url.path": p.path or None,
                "http.response.status_code": p.status,
                "error.type": p.error,
                "amb.via": p.via,
            }
            self.child(e, p.method or "request", CLIENT, begin, end, a, p.error)
        elif isinstance(p, ROOT_EVENTS):
            event = {"timeUnixNano": str(e.ts_ns), "name": e.kind, "attributes": attrs(_root_event_attrs(p))}
            self.root_events.append(_json(event))

    def model_call(self, e: Event, p: ModelCallCompleted) -> None:
        begin = p.started_ns or e.ts_ns
        self.calls_started[p.call_id] = begin
        end = begin + int(p.latency_ms * 1e6) if p.latency_ms is not None else begin
        a = _call_attrs(p, self.run_id)
        if self.read_blob is not None:
            a.update(messages(p, self.read_blob))
        error = None
        if not p.ok or p.partial:
            error = p.error or (f"{p.status}" if p.status else "partial")
            a["error.type"] = error
        self.child(e, f"chat {p.model or ''}".strip(), CLIENT, begin, end, a, error)

    def tool_result(self, e: Event, p: ToolCallResult) -> None:
        pair = self.asked.pop(p.tool_call_id, None)
        if pair is None:
            return
        req_ev, req = pair
        end = self.calls_started.get(p.model_call_id, e.ts_ns)
        error = "tool_error" if p.is_error else None
        a = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": req.name,
            "gen_ai.tool.call.id": req.tool_call_id,
            "gen_ai.tool.type": "function",
            "error.type": error,
        }
        start = req_ev.ts_ns
        self.child(req_ev, f"execute_tool {req.name}", INTERNAL, start, max(end, start), a, error)

    def process(self, e: Event, p: ProcessExited) -> None:
        a = {
            "process.pid": p.pid,
            "process.parent_pid": p.ppid,
            "process.command_args": list(p.argv),
            "process.exit.code": p.exit_code,
            "amb.signal": p.signal,
            "amb.tracer": p.tracer,
        }
        name = os.path.basename(p.argv[0]) if p.argv else "process"
        err = f"exit {p.exit_code}" if p.exit_code not in (0, None) else None
        self.child(e, name, INTERNAL, p.start_ns or e.ts_ns, p.end_ns or e.ts_ns, a, err)


def write_line(
    out: TextIO, events: Iterable[Event], scope_version: str = "", read_blob: BlobReader | None = None
) -> None:
    """One run's ``TracesData`` (OTLP JSON) as one line, from its events in ``replay.read.iter_events``'
    order (``read_blob``: with each model call's messages). Written piece by piece: the line is the
    same as ``json.dumps`` of the whole with compact separators."""
    children = _Spans(read_blob)
    for e in events:
        children.see(e)
    if children.first_ev is None or children.last_ev is None:
        raise ValueError("no events")
    run_id = children.run_id
    start_ev = children.start_ev or children.first_ev
    finish_ev = children.finish_ev
    first, last = start_ev.payload, finish_ev.payload if finish_ev is not None else None
    started = first if isinstance(first, RunStarted) else RunStarted()
    finished = last if isinstance(last, RunFinished) else None
    status = finished.status if finished else "unfinished"
    agent = started.agent or "amb-agent"
    a = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": run_id,
        "gen_ai.request.model": started.model,
        "amb.status": status,
        "amb.exit_code": finished.exit_code if finished else None,
    }
    error = None if status in ("completed", UNKNOWN_ENDING) else status
    end = (finish_ev or children.last_ev).ts_ns
    root_id = span_id(run_id, start_ev.source, start_ev.seq)
    root = _span(run_id, start_ev, f"invoke_agent {agent}", INTERNAL, start_ev.ts_ns, end, a, error)
    resource = {
        "service.name": agent,
        "amb.run_id": run_id,
        "amb.task": started.task,
        "amb.tier": started.tier,
        "amb.backend": started.backend,
        "amb.semconv.genai": SEMCONV_VERSION,
    }
    head = {"resource": {"attributes": attrs(resource)}, "scopeSpans": [{"scope": {}}]}
    out.write('{"resourceSpans":[' + _json(head).removesuffix("{}}]}"))  # up to the scope, left open
    out.write(_json({"name": SCOPE, "version": scope_version}) + ',"spans":[')
    out.write(_json(root)[:-1] + ',"events":[')
    out.write(",".join(children.root_events))
    out.write("]}")
    parent = f',"parentSpanId":{_json(root_id)}}}'
    for span in children.spans:
        out.write("," + span + parent)
    out.write(f'],"schemaUrl":{_json(SCHEMA_URL)}}}],"schemaUrl":{_json(SCHEMA_URL)}}}]}}\n')


def line(events: Iterable[Event], scope_version: str = "", read_blob: BlobReader | None = None) -> str:
    """One OTLP JSON line (no newline), from events in ``replay.read.iter_events``' order."""
    buf = io.StringIO()
    write_line(buf, events, scope_version, read_blob)
    return buf.getvalue().removesuffix("\n")
