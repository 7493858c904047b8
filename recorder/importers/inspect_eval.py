"""Inspect AI eval logs (``.eval`` and ``.json``) as AMB runs, one per (log, sample, epoch).

The stable interface of Inspect logs is ``inspect_ai.log`` (the ``.eval`` zip layout is versioned
but not frozen), so this module never opens the files itself, except to refuse a ``.eval`` whose
zip members expand past the file cap; ``inspect_ai`` is an optional extra imported only here.
Inspect's ``input_tokens`` excludes cached input; ours includes it. docs/interop.md has the mapping.
"""

from __future__ import annotations

import hashlib
import shlex
import zipfile
from pathlib import Path
from typing import Any

from recorder.importers.common import (
    DEFAULT_CAPS,
    ORIGIN_SCORES,
    ImportCaps,
    Rejected,
    RunBuilder,
    TaskResolver,
    check_file,
)
from recorder.importers.values import count, iso_ns, seconds, shown, whole
from schemas import providers
from schemas.blob import digest
from schemas.display import for_message
from schemas.events import (
    AssistantMessage,
    FileAccessed,
    FileWritten,
    ModelCallCompleted,
    Note,
    Payload,
    ProcessExited,
    RunFinished,
    RunStarted,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from schemas.ostext import os_text
from schemas.providers.conversation import json_text

NOTE_EVENTS = ("info", "logger", "input", "approval")


def _content(value: Any) -> tuple[str, str]:
    """(text, reasoning) of a message content or tool result of any Inspect shape."""
    if value is None:
        return "", ""
    if isinstance(value, str | int | float | bool):
        return str(value), ""
    parts = value if isinstance(value, list) else [value]
    text, reasoning = [], []
    for p in parts:
        kind = getattr(p, "type", None)
        if kind == "text":
            text.append(str(getattr(p, "text", "")))
        elif kind == "reasoning":
            reasoning.append(str(getattr(p, "reasoning", "") or getattr(p, "summary", "") or ""))
        elif isinstance(p, str):
            text.append(p)
        elif kind:
            text.append(f"[{kind}]")
    return "\n".join(text), "\n".join(x for x in reasoning if x)


def _dump(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else obj


def _expanded_bytes(path: Path) -> int | None:
    """What a zip's members expand to, by its directory (None: not a zip). Python's ``zipfile``,
    which Inspect's reader uses, stops a member at its declared size, so this bounds the reading."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as z:
            return sum(info.file_size for info in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return None  # Inspect's reader words what is wrong with it


def _samples(path: Path, limits: ImportCaps) -> tuple[Any, list[Any]]:
    from inspect_ai.log import read_eval_log

    # A .eval log is a zip: a few kilobytes can expand to gigabytes, all of which the reader would
    # hold in memory. The file cap bounds what its members expand to as well as the file itself.
    expanded = _expanded_bytes(path)
    if expanded is not None and expanded > limits.max_file_bytes:
        raise Rejected(
            f"{shown(path)}: its members expand to {expanded} bytes, above the {limits.max_file_bytes}-byte"
            " file cap (--max-file-bytes)"
        )
    try:
        log = read_eval_log(str(path), resolve_attachments="full")
    except Exception as e:  # the reader raises many types for a file that is not a log
        raise Rejected(
            f"{shown(path)}: not an Inspect eval log ({type(e).__name__}: {for_message(str(e))})"
        ) from e
    return log, list(log.samples or [])


def parse(
    path: Path, *, resolve_task: TaskResolver = lambda t: t, limits: ImportCaps = DEFAULT_CAPS
) -> list[RunBuilder]:
    """One in-memory run per sample and epoch of the log (nothing is written)."""
    path = Path(path).resolve()
    check_file(path.parent, path, limits)
    log, samples = _samples(path, limits)
    if not samples:
        raise Rejected(f"{shown(path)}: the log holds no samples")
    return [_sample(log, s, resolve_task, shown(path)) for s in samples]


def _sample(log: Any, sample: Any, resolve_task: TaskResolver, file: str) -> RunBuilder:
    spec = log.eval
    h = hashlib.sha256(f"{spec.eval_id}\0{sample.id}\0{sample.epoch}".encode())
    where = f"{file}: sample {for_message(str(sample.id), 80)} epoch {sample.epoch}"
    b = RunBuilder("inspect-" + h.hexdigest()[:16], origin=where)
    start = (
        iso_ns(sample.started_at, f"{where}: started_at")
        or iso_ns(spec.created, f"{file}: eval.created")
        or 0
    )
    events = _Events(b, where, start)
    events.read(list(_flatten(sample.events or [])))
    status, reason = events.status, events.reason
    if sample.error is not None:
        status, reason = "failed", str(getattr(sample.error, "message", sample.error))[:4000]
    for name, score in (sample.scores or {}).items():
        text = f"the source's own score {name} (kept for comparison, never scored)"
        events.out.append(
            (start, Note(text=text, data={"kind": ORIGIN_SCORES, "scorer": name, "score": _dump(score)}))
        )
    labels = {
        "origin": "inspect",
        "inspect_eval_id": spec.eval_id,
        "inspect_run_id": spec.run_id,
        "eval_set_id": spec.eval_set_id,
        "inspect_task": spec.task,
        "sample_id": sample.id,
        "sample_uuid": sample.uuid,
        "epoch": sample.epoch,
    }
    time_limit = getattr(spec.config, "time_limit", None) or None
    started = RunStarted(
        task=resolve_task(spec.task) if spec.task else None,
        agent=spec.solver or "inspect",
        model=spec.model,
        command=[],
        backend="import",
        time_limit_s=seconds(time_limit, f"{file}: eval.config.time_limit"),
        labels={k: str(v) for k, v in labels.items() if v is not None},
    )
    b.emit(started, start)
    for ts, payload in sorted(events.out, key=lambda tp: tp[0]):
        b.emit(payload, ts)
    end = iso_ns(sample.completed_at, f"{where}: completed_at") or b.last_ts
    total = seconds(sample.total_time, f"{where}: total_time")
    b.emit(RunFinished(status=status, duration_s=total or (end - start) / 1e9, reason=reason), end)
    b.note_clamps()
    return b


class _Events:
    """A sample's events (flattened) as timed payloads, and how the sample ended."""

    def __init__(self, b: RunBuilder, where: str, start: int):
        self.b, self.where, self.start = b, where, start
        self.out: list[tuple[int, Payload]] = []
        self.status: str = "completed"
        self.reason: str | None = None

    def read(self, events: list[Any]) -> None:
        model_ids = [(i, e.uuid or f"m{i:04d}") for i, e in enumerate(events) if e.event == "model"]
        for i, ev in enumerate(events):
            ts = iso_ns(ev.timestamp, f"{self.where}: event {i + 1} ({ev.event}): timestamp") or self.start
            kind = ev.event
            if kind == "model":
                self.out += _model(self.b, ev, next(c for j, c in model_ids if j == i), ts)
            elif kind == "tool":
                carried = next((c for j, c in model_ids if j > i), None)
                asked = next((c for j, c in reversed(model_ids) if j < i), "")
                self.tool(ev, carried or asked, ts, f"{self.where}: event {i + 1} (tool): completed")
            elif kind == "sandbox":
                self.out += _sandbox(self.b, ev, ts)
            else:
                self.note(ev, kind, ts)

    def tool(self, ev: Any, carried_by: str, ts: int, where: str) -> None:
        text, _ = _content(ev.result)
        result = ToolCallResult(
            tool_call_id=str(ev.id),
            model_call_id=carried_by,
            name=ev.function,
            output=text,
            is_error=ev.error is not None or bool(getattr(ev, "failed", False)),
        )
        self.out.append((iso_ns(ev.completed, where) or ts, result))

    def note(self, ev: Any, kind: str, ts: int) -> None:
        """Limits, errors, scores (the source's own), info, logger, input and approval events."""
        if kind == "sample_limit":
            reason = f"{ev.type} limit: {ev.message}"
            self.status, self.reason = ("timeout" if ev.type in ("time", "working") else "failed"), reason
            self.out.append((ts, Note(text=reason, data={"kind": "inspect.sample_limit", "type": ev.type})))
        elif kind == "error":
            reason = str(getattr(ev.error, "message", ev.error))
            self.status, self.reason = "failed", reason
            self.out.append((ts, Note(text=reason[:4000], data={"kind": "inspect.error"})))
        elif kind == "score":
            text = "the source's own score (kept for comparison, never scored)"
            data = {"kind": ORIGIN_SCORES, "scorer": getattr(ev, "scorer", None), "score": _dump(ev.score)}
            self.out.append((ts, Note(text=text, data=data)))
        elif kind in NOTE_EVENTS:
            skip = ("uuid", "span_id", "timestamp", "working_start")
            data = {"kind": f"inspect.{kind}", "event": {k: v for k, v in _dump(ev).items() if k not in skip}}
            self.out.append((ts, Note(text=f"inspect {kind} event", data=data)))


def _flatten(events: list[Any]) -> Any:
    for ev in events:
        yield ev
        if getattr(ev, "event", None) == "tool" and ev.events:
            yield from _flatten(list(ev.events))


def _model(b: RunBuilder, ev: Any, call_id: str, ts: int) -> list[tuple[int, Payload]]:
    out = ev.output
    choice = out.choices[0] if out is not None and out.choices else None
    msg = choice.message if choice is not None else None
    text, reasoning = _content(msg.content) if msg is not None else ("", "")
    tool_calls = [
        ToolCallPart(id=str(tc.id), name=str(tc.function), arguments=json_text(tc.arguments))
        for tc in (msg.tool_calls or [] if msg is not None else [])
    ]
    call = ev.call
    wire = providers.by_shape(call.request if call is not None else None)  # the raw request's shape
    provider, api = (wire.provider, wire.api) if wire is not None else ("inspect", "generate")
    if call is not None and isinstance(call.request, dict):
        request = b.json_blob(call.request, "application/json")
    else:
        request = b.json_blob(
            {
                "model": ev.model,
                "input": [_dump(m) for m in ev.input],
                "tools": [_dump(t) for t in ev.tools],
                "config": _dump(ev.config),
            }
        )
    if call is not None and call.response is not None:
        response = b.json_blob(call.response, "application/json")
    else:
        response = b.json_blob(_dump(out) if out is not None else {})
    where = f"{b.origin}: model event {call_id}"
    u = out.usage if out is not None else None
    usage = _usage(u, f"{where}: usage") if u is not None else Usage(reported=False)
    completed = iso_ns(ev.completed, f"{where}: completed")
    at = completed or ts
    completed_call = ModelCallCompleted(
        call_id=call_id,
        provider=provider,
        api=api,
        model=(out.model if out is not None and out.model else None) or ev.model,
        ok=ev.error is None,
        error=str(ev.error)[:2000] if ev.error is not None else None,
        status=200 if ev.error is None else None,
        request=request,
        response=response,
        message=AssistantMessage(text=text, reasoning=reasoning, tool_calls=tool_calls),
        stop_reason=choice.stop_reason if choice is not None else None,
        usage=usage,
        started_ns=ts,
        latency_ms=(completed - ts) / 1e6 if completed else None,
        retries=count(ev.retries, f"{where}: retries"),
    )
    payloads: list[tuple[int, Payload]] = [(at, completed_call)]
    payloads += [
        (at, ToolCallRequested(t.id, t.name, t.arguments, model_call_id=call_id)) for t in tool_calls
    ]
    if ev.cache == "read":
        text = "served from Inspect's cache (no upstream call)"
        payloads.append((at, Note(text=text, data={"kind": "inspect.cache_read", "call_id": call_id})))
    return payloads


def _usage(u: Any, where: str) -> Usage:
    """Inspect's usage in ours: its ``input_tokens`` excludes cached input, ours includes it."""
    cache_read = count(u.input_tokens_cache_read, f"{where}.input_tokens_cache_read")
    cache_write = count(u.input_tokens_cache_write, f"{where}.input_tokens_cache_write")
    return Usage(
        input_total=count(u.input_tokens, f"{where}.input_tokens") + cache_read + cache_write,
        cache_read=cache_read,
        cache_write=cache_write,
        output=count(u.output_tokens, f"{where}.output_tokens"),
        reasoning=count(u.reasoning_tokens, f"{where}.reasoning_tokens"),
    )


def _sandbox(b: RunBuilder, ev: Any, ts: int) -> list[tuple[int, Payload]]:
    where = f"{b.origin}: sandbox event"
    end = iso_ns(ev.completed, f"{where}: completed") or ts
    event: Payload
    if ev.action == "exec":
        try:
            argv = shlex.split(ev.cmd or "")
        except ValueError:
            argv = [ev.cmd or ""]
        output = ev.output or ""
        event = ProcessExited(
            pid=0,
            argv=[os_text(a) for a in argv],
            start_ns=ts,
            end_ns=end,
            exit_code=whole(ev.result, f"{where}: result", -(1 << 31), (1 << 31) - 1)
            if isinstance(ev.result, int)
            else None,
            tracer="inspect-sandbox",
            stdout=b.blob(output.encode(), "text/plain") if output else None,
        )
    elif ev.action == "read_file":
        event = FileAccessed(path=os_text(str(ev.file or "")))
    elif ev.action == "write_file":
        data = (ev.input or "").encode()
        path, content = os_text(str(ev.file or "")), b.blob(data, "application/octet-stream")
        event = FileWritten(path=path, size=len(data), sha256=digest(data), content=content)
    else:
        return []
    return [(end, event)]
