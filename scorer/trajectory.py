"""A run's events folded into the facts every scorer part reads (evidence, judges, codes, audit, cost).

A pure function of the events and their blobs: no clock, no randomness, no store access beyond
``get_blob``. Events are ordered by ``(ts_ns, source, seq)``, the read-back order, and re-sorted here
so a caller's order never changes a score. Every fact keeps the id of the event it came from
(``"<source>:<seq>"``), which is what error codes and violations cite.

Code executions are the agent's tool calls (requested by the model, answered by the harness). An
AutoMedBench-style result ``{"exit_code", "stdout", "stderr"}`` gives the exit code; other harnesses
give only ``is_error``. Files written by the shim are attributed to the execution whose time window
contains them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from schemas import providers
from schemas.codec import Event
from schemas.errors import BlobError
from schemas.events import (
    FileAccessed,
    FileDeleted,
    FileRenamed,
    FileWritten,
    ModelCallCompleted,
    NetworkRequest,
    Note,
    ProcessExited,
    RunFinished,
    RunStarted,
    SubmissionSealed,
    ToolCallRequested,
    ToolCallResult,
)
from schemas.providers import render
from schemas.untrusted_json import loads_untrusted

BlobGetter = Callable[[Any], bytes]

CODE_KEYS = ("code", "command", "cmd", "script", "source", "input")


def eid(event: Event) -> str:
    """The id an error code or violation cites: ``<source>:<seq>`` (unique within a run)."""
    return f"{event.source}:{event.seq}"


class Exec(msgspec.Struct, kw_only=True):
    id: str
    """Event id of the ``tool_call.requested``."""
    tool: str
    language: str
    code: str
    ts_ns: int
    result_id: str | None = None
    end_ns: int | None = None
    exit_code: int | None = None
    ok: bool | None = None
    """True/False when the result says so; None when no result was recorded."""
    stdout: str = ""
    stderr: str = ""
    output: str = ""
    files: list[str] = []
    """Workspace paths written while this execution ran."""


class Message(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    role: str
    text: str


class Trajectory(msgspec.Struct, kw_only=True):
    run_id: str
    n_events: int = 0
    task: str | None = None
    tier: str | None = None
    agent: str | None = None
    model: str | None = None
    labels: dict[str, str] = {}
    workspace: str | None = None
    backend: str | None = None
    tool_versions: dict[str, str] = {}
    started_ns: int | None = None
    status: str | None = None
    """``run.finished`` status, None when the run has no end event."""
    finished_id: str | None = None
    duration_s: float | None = None
    messages: list[Message] = []
    model_calls: list[tuple[str, ModelCallCompleted]] = []
    execs: list[Exec] = []
    processes: list[tuple[str, ProcessExited]] = []
    writes: list[tuple[str, int, FileWritten]] = []
    """(event id, ts_ns, payload) for every file.written, in order."""
    accesses: list[tuple[str, FileAccessed]] = []
    renames: list[tuple[str, FileRenamed]] = []
    deletes: list[tuple[str, FileDeleted]] = []
    network: list[tuple[str, NetworkRequest]] = []
    submission_id: str | None = None
    submission: SubmissionSealed | None = None
    blob_errors: list[str] = []
    notes: list[tuple[str, Note]] = []
    """Every note (an importer's ``import.limitation`` notes say what the source did not keep)."""

    @property
    def limitations(self) -> list[str]:
        """The ``import.limitation`` keys of an imported run (empty for a recorded one)."""
        return [
            n.data.get("limitation", "") for _, n in self.notes if n.data.get("kind") == "import.limitation"
        ]

    @property
    def activity(self) -> int:
        """How many agent-side facts exist (0 = nothing to judge: audit says ``no_data``)."""
        agent = (self.model_calls, self.execs, self.processes, self.network)
        files = (self.writes, self.accesses, self.renames, self.deletes)
        return sum(len(facts) for facts in (*agent, *files))

    def last_write(self, suffix: str) -> tuple[str, FileWritten] | None:
        for ev_id, _, w in reversed(self.writes):
            if w.path == suffix or w.path.endswith("/" + suffix):
                return ev_id, w
        return None


def blob_or_empty(get_blob: BlobGetter, ref: Any) -> bytes:
    """A written file's content; empty when it was not stored or cannot be read (a judge states what
    it saw, and a missing blob must not stop the scoring)."""
    if ref is None:
        return b""
    try:
        return get_blob(ref)
    except Exception:
        return b""


def _text(get_blob: BlobGetter, ref: Any, traj: Trajectory) -> str:
    if ref is None:
        return ""
    try:
        return get_blob(ref).decode("utf-8", "replace")
    except BlobError as e:
        traj.blob_errors.append(str(e))
        return ""


def _parse_args(raw: str) -> tuple[str, str]:
    """(language, code) from a tool call's raw argument string; the raw string when it is not JSON."""
    try:
        args = loads_untrusted(raw)
    except (ValueError, TypeError):
        return "", raw
    if not isinstance(args, dict):
        return "", raw
    language = str(args.get("language") or args.get("lang") or "")
    for key in CODE_KEYS:
        value = args.get(key)
        if isinstance(value, str):
            return language, value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return language or "bash", " ".join(value)
    return language, raw


def _parse_result(text: str) -> tuple[int | None, str, str]:
    """(exit_code, stdout, stderr) from an AutoMedBench-style JSON result; else (None, text, "")."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = loads_untrusted(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict) and ("exit_code" in data or "stdout" in data):
            code = data.get("exit_code")
            return (
                code if isinstance(code, int) and not isinstance(code, bool) else None,
                str(data.get("stdout") or ""),
                str(data.get("stderr") or ""),
            )
    return None, text, ""


def _initial_messages(api: str, body: bytes) -> list[tuple[str, str]]:
    """System and user messages that precede the first assistant turn of a request body."""
    try:
        req = loads_untrusted(body)
    except ValueError:
        return []
    return render.opening(providers.conversation(api, req))


def fold(run_id: str, events: list[Event], get_blob: BlobGetter) -> Trajectory:
    """Fold a run's events into its facts."""
    evs = sorted(events, key=lambda e: (e.ts_ns, e.source, e.seq))
    t = Trajectory(run_id=run_id, n_events=len(evs))
    pending: dict[str, Exec] = {}
    messages: list[Message] = []
    first_request_done = False
    facts: dict[type, list[tuple[str, Any]]] = {ProcessExited: t.processes, FileAccessed: t.accesses}
    facts |= {FileRenamed: t.renames, FileDeleted: t.deletes, NetworkRequest: t.network, Note: t.notes}
    for e in evs:
        p = e.payload
        i = eid(e)
        if isinstance(p, RunStarted):
            t.task, t.tier, t.agent, t.model = p.task, p.tier, p.agent, p.model
            t.labels, t.workspace, t.started_ns = dict(p.labels), p.workspace, e.ts_ns
            t.backend, t.tool_versions = p.backend, dict(p.tool_versions)
        elif isinstance(p, RunFinished):
            t.status, t.finished_id, t.duration_s = p.status, i, p.duration_s
        elif isinstance(p, ModelCallCompleted):
            t.model_calls.append((i, p))
            if not first_request_done and p.request is not None:
                first_request_done = True
                body = _text(get_blob, p.request, t).encode()
                for role, text in _initial_messages(p.api, body):
                    messages.append(Message(id=i, role=role, text=text))
            if p.message.text or p.message.reasoning:
                messages.append(Message(id=i, role="assistant", text=p.message.text))
            for tc in p.message.tool_calls:
                messages.append(Message(id=i, role="tool_call", text=f"{tc.name}: {tc.arguments}"))
            if not p.ok:
                messages.append(Message(id=i, role="error", text=f"model call failed: {p.error or p.status}"))
        elif isinstance(p, ToolCallRequested):
            language, code = _parse_args(p.arguments)
            ex = Exec(id=i, tool=p.name, language=language, code=code, ts_ns=e.ts_ns)
            pending[p.tool_call_id] = ex
            t.execs.append(ex)
        elif isinstance(p, ToolCallResult):
            text = p.output if p.output_blob is None else _text(get_blob, p.output_blob, t)
            messages.append(Message(id=i, role="tool", text=text))
            answered = pending.pop(p.tool_call_id, None)
            if answered is not None:
                exit_code, out, err = _parse_result(text)
                answered.result_id, answered.end_ns, answered.output = i, e.ts_ns, text
                answered.exit_code, answered.stdout, answered.stderr = exit_code, out, err
                if exit_code is not None:
                    answered.ok = exit_code == 0
                elif p.is_error is not None:
                    answered.ok = not p.is_error
                else:
                    answered.ok = "Traceback (most recent call last)" not in text
        elif isinstance(p, FileWritten):
            t.writes.append((i, e.ts_ns, p))
        elif isinstance(p, SubmissionSealed):
            t.submission_id, t.submission = i, p
        elif type(p) in facts:
            facts[type(p)].append((i, p))
    t.messages = messages
    if t.model is None and t.model_calls:
        names = [c.model for _, c in t.model_calls if c.model]
        if names:
            t.model = max(sorted(set(names)), key=names.count)
    for ex in t.execs:
        end = ex.end_ns if ex.end_ns is not None else ex.ts_ns
        ex.files = [w.path for _, ts, w in t.writes if ex.ts_ns <= ts <= end]
    return t
