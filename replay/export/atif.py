"""A stored run as an ATIF trajectory (Harbor's Agent Trajectory Interchange Format, v1.8 or v1.6).

One agent step per successful model call, with system and user steps from the request bodies.
What ATIF has no place for (processes, file changes, network requests, the submission, notes, failed
calls, the run's start and end: invented steps would mislead its SFT and RL consumers) goes verbatim
to a sidecar ``events.jsonl`` (blobs under ``blobs/``), and ``step.extra.amb`` keeps each call's
envelope, so ``amb import atif`` gives the run back (docs/interop.md says what is lost).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import msgspec

from replay.export import BlobReader
from replay.read import iter_events
from replay.summary import Tokens
from schemas import atif, providers
from schemas.codec import Event, json_line
from schemas.errors import AmbError
from schemas.events import (
    ModelCallCompleted,
    RunFinished,
    RunStarted,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from schemas.providers import openai_chat
from schemas.providers.conversation import Message, json_text
from schemas.untrusted_json import loads_untrusted


class Exported(NamedTuple):
    trajectory: dict[str, Any]
    sidecar: list[bytes]
    """Each sidecar line, encoded (``schemas.codec.json_line``), without its newline."""
    blobs: list[str]
    """Every blob the sidecar refers to (copied beside it so an import elsewhere has them)."""
    events: int
    """How many events it was built from."""


def _request(api: str, body: bytes) -> tuple[str | None, list[Message], list[dict[str, Any]]]:
    """(system prompt, messages without it, tool definitions in OpenAI's function shape, as ATIF
    has them) of a request body of any supported API."""
    try:
        conv = providers.conversation(api, loads_untrusted(body))
    except ValueError:
        return None, [], []
    return conv.system(), conv.rest(), [openai_chat.tool_entry(t) for t in conv.tools]


def _new_user_messages(messages: list[Message], first: bool) -> list[str]:
    """User text a request adds: all of it before the first answer, else what follows the last one."""
    if not first:
        last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        messages = messages[last + 1 :]
    out = []
    for m in messages:
        if m.role == "assistant":
            break
        if m.role in ("user", "developer") and m.text:
            out.append(m.text)
    return out


def _arguments(raw: str) -> tuple[dict[str, Any], bool]:
    """(ATIF arguments object, is the raw string exactly its compact JSON?)."""
    try:
        value = loads_untrusted(raw)
    except ValueError:
        return {}, False
    if not isinstance(value, dict):
        return {}, False
    return value, json_text(value) == raw


class _Export:
    """One run's export in progress: the steps so far, what goes to the sidecar, and where each
    model call's and tool call's step is (later events add to it)."""

    def __init__(self, read_blob: BlobReader, version: str) -> None:
        self.read_blob, self.version = read_blob, version
        self.steps: list[atif.Step] = []
        self.sidecar: list[bytes] = []
        """Encoded as they come: a run of a million events holds its sidecar's bytes, not its events."""
        self.sidecar_blobs: set[str] = set()
        self.run_id = ""
        self.events = 0
        self.started: RunStarted | None = None
        self.finished: RunFinished | None = None
        self.notes: list[str] = []
        self.tool_definitions: list[dict[str, Any]] = []
        self.step_of_call: dict[str, atif.Step] = {}
        self.step_of_tool: dict[str, atif.Step] = {}
        self.first_request = True
        self.totals = Tokens()
        self.counts = {"failed_model_calls": 0, "processes": 0, "file_writes": 0, "network_requests": 0}

    def add(self, step: atif.Step) -> atif.Step:
        step.step_id = len(self.steps) + 1
        self.steps.append(step)
        return step

    def event(self, e: Event) -> None:
        p = e.payload
        self.events += 1
        self.run_id = self.run_id or e.run_id
        if self.started is None and isinstance(p, RunStarted):
            self.started = p
        if self.finished is None and isinstance(p, RunFinished):
            self.finished = p
        if isinstance(p, ModelCallCompleted) and p.ok:
            self.model_call(e, p)
        elif not (isinstance(p, ToolCallRequested) and self.requested(e, p)) and not (
            isinstance(p, ToolCallResult) and self.result(e, p)
        ):
            self.aside(e)

    def model_call(self, e: Event, p: ModelCallCompleted) -> None:
        when = atif.timestamp(p.started_ns or e.ts_ns)
        if p.request is not None:
            self.request_steps(p.api, self.read_blob(p.request), when)
        step = atif.Step(
            timestamp=when,
            source="agent",
            message=p.message.text,
            model_name=p.model or None,
            reasoning_content=p.message.reasoning or None,
            metrics=_metrics(p.usage),
            llm_call_count=1 if self.version == "1.8" else None,
        )
        # The call's envelope: the fields of ModelCallCompleted that CallFacts names.
        call = msgspec.convert(p, atif.CallFacts, from_attributes=True)
        raw_args = self.tool_calls(step, p) or None
        facts = atif.StepFacts(call_id=p.call_id, ts_ns=e.ts_ns, call=call, raw_arguments=raw_args)
        step.extra = atif.StepExtra(facts)
        self.totals.add(p.usage)
        self.step_of_call[p.call_id] = self.add(step)

    def request_steps(self, api: str, body: bytes, when: str) -> None:
        """The system and user steps a request adds (the first one: its system prompt and tools)."""
        system, messages, tools = _request(api, body)
        if self.first_request:
            if system:
                self.add(atif.Step(timestamp=when, source="system", message=system))
            self.tool_definitions = tools
        for text in _new_user_messages(messages, self.first_request):
            self.add(atif.Step(timestamp=when, source="user", message=text))
        self.first_request = False

    def tool_calls(self, step: atif.Step, p: ModelCallCompleted) -> dict[str, str]:
        """Fill the step's tool calls (arguments as objects); the raw argument strings an object
        does not spell exactly, by tool call id."""
        raw_args: dict[str, str] = {}
        calls: list[atif.ToolCall] = []
        for tc in p.message.tool_calls:
            args, exact = _arguments(tc.arguments)
            if not exact:
                raw_args[tc.id] = tc.arguments
                if not args and tc.arguments.strip() not in ("", "{}"):
                    self.notes.append(
                        f"step {len(self.steps) + 1}: arguments of {tc.id} are not a JSON object"
                    )
            calls.append(atif.ToolCall(tool_call_id=tc.id, function_name=tc.name, arguments=args))
            self.step_of_tool[tc.id] = step
        step.tool_calls = calls or None
        return raw_args

    def requested(self, e: Event, p: ToolCallRequested) -> bool:
        """Note when a tool call of a step was asked for; False when no step holds it."""
        owner = self.step_of_call.get(p.model_call_id)
        if owner is None or not any(t.tool_call_id == p.tool_call_id for t in owner.tool_calls or []):
            return False
        facts = _facts(owner)
        facts.requested = facts.requested or {}
        facts.requested[p.tool_call_id] = atif.Requested(e.ts_ns)
        return True

    def result(self, e: Event, p: ToolCallResult) -> bool:
        """A tool result into its step's observation (in full); False when no step holds its call."""
        owner = self.step_of_tool.get(p.tool_call_id)
        if owner is None:
            return False
        text = p.output if p.output_blob is None else self.read_blob(p.output_blob).decode("utf-8", "replace")
        owner.observation = owner.observation or atif.Observation()
        owner.observation.results.append(atif.ObservationResult(source_call_id=p.tool_call_id, content=text))
        result = atif.ResultFacts(
            ts_ns=e.ts_ns,
            model_call_id=p.model_call_id,
            name=p.name,
            is_error=p.is_error,
            inline_chars=len(p.output) if p.output_blob is not None else None,
        )
        facts = _facts(owner)
        facts.results = facts.results or []
        facts.results.append(result)
        return True

    def aside(self, e: Event) -> None:
        """An event ATIF has no slot for: to the sidecar, counted."""
        self.counts["failed_model_calls"] += isinstance(e.payload, ModelCallCompleted)
        self.counts["processes"] += e.kind == "process.exited"
        self.counts["file_writes"] += e.kind == "file.written"
        self.counts["network_requests"] += e.kind == "network.request"
        line = {"ts_ns": e.ts_ns, "kind": e.kind, "v": e.v, "payload": msgspec.to_builtins(e.payload)}
        self.sidecar.append(json_line(line).encode())
        self.sidecar_blobs.update(atif.blob_refs(e.payload))

    def trajectory(self) -> atif.Trajectory:
        run_id, started, finished = self.run_id, self.started, self.finished
        if not self.steps:
            note = atif.StepFacts(note="the run has no model calls")
            self.add(atif.Step(source="system", message="", extra=atif.StepExtra(note)))
        labels = dict(started.labels) if started else {}
        return atif.Trajectory(
            schema_version=atif.VERSIONS[self.version],
            session_id=labels.get("atif_session_id") or run_id,
            agent=_agent(started, self.tool_definitions),
            steps=self.steps,
            notes="; ".join(self.notes) or None,
            final_metrics=atif.FinalMetrics(
                total_prompt_tokens=self.totals.input,
                total_completion_tokens=self.totals.output,
                total_cached_tokens=self.totals.cache_read,
                total_steps=len(self.steps),
                extra={**self.counts, "sidecar_events": len(self.sidecar)},
            ),
            extra=atif.TrajectoryExtra(
                atif.RunFacts(
                    run_id=run_id,
                    task=started.task if started else None,
                    tier=started.tier if started else None,
                    backend=started.backend if started else None,
                    status=finished.status if finished else "unfinished",
                    sidecar=atif.SIDECAR,
                )
            ),
        )


def _facts(step: atif.Step) -> atif.StepFacts:
    # Every agent step an export made carries extra.amb.
    assert step.extra is not None and step.extra.amb is not None
    return step.extra.amb


def _metrics(u: Usage) -> atif.Metrics:
    return atif.Metrics(
        prompt_tokens=u.input_total,
        completion_tokens=u.output,
        cached_tokens=u.cache_read,
        extra=atif.TokenExtra(
            cache_write_tokens=u.cache_write, reasoning_tokens=u.reasoning, reported=u.reported
        ),
    )


def _agent(started: RunStarted | None, tool_definitions: list[dict[str, Any]]) -> atif.Agent:
    name = (started.agent if started else None) or "unknown"
    versions = dict(started.tool_versions) if started else {}
    return atif.Agent(
        name=name,
        version=versions.get(name) or versions.get("amb") or "unknown",
        model_name=(started.model if started else None) or None,
        tool_definitions=tool_definitions or None,
    )


def build(events: Iterable[Event], read_blob: BlobReader, version: str = "1.8") -> Exported:
    """The ATIF document, sidecar lines and sidecar blobs of one run's events, in time order (then
    source and seq): a list is sorted so; any other iterable must come in that order, as
    ``replay.read.iter_events`` gives it, and is taken one event at a time."""
    if version not in atif.VERSIONS:
        raise AmbError(f"unknown ATIF version {version!r} (use {' or '.join(atif.VERSIONS)})")
    if isinstance(events, list):
        events = sorted(events, key=lambda e: (e.ts_ns, e.source, e.seq))
    export = _Export(read_blob, version)
    for e in events:
        export.event(e)
    trajectory = msgspec.to_builtins(export.trajectory())
    return Exported(trajectory, export.sidecar, sorted(export.sidecar_blobs), export.events)


def export_run(
    con: duckdb.DuckDBPyConnection, read_blob: BlobReader, run_id: str, out: Path, version: str = "1.8"
) -> Path:
    """Write ``out/<run>/trajectory.json``, ``events.jsonl`` and ``blobs/``; returns the folder."""
    exported = build(iter_events(con, run_id), read_blob, version)
    if not exported.events:
        raise AmbError(f"no run {run_id!r} in the store (see `amb runs`)")
    folder = out / run_id
    (folder / atif.BLOB_DIR).mkdir(parents=True, exist_ok=True)
    (folder / atif.TRAJECTORY).write_text(
        json.dumps(exported.trajectory, indent=2, ensure_ascii=False, sort_keys=False) + "\n",
        encoding="utf-8",
    )
    with open(folder / atif.SIDECAR, "w", encoding="utf-8") as f:
        for line in exported.sidecar:
            f.write(line.decode() + "\n")
    for ref in exported.blobs:
        target = folder / atif.BLOB_DIR / ref.removeprefix("sha256:")
        if not target.exists():
            target.write_bytes(read_blob(ref))
    return folder
