"""ATIF trajectories (Harbor's format, v1.0-v1.8) as AMB runs.

Agent steps become model calls (bodies rebuilt from the steps, marked synthetic), their tool calls
and observation results tool events. What ``amb export atif`` kept (``step.extra.amb``, the sidecar
``events.jsonl`` and its ``blobs/``) is read back, so such a run comes back as it was exported.
Image parts are never opened (a path that leaves the trajectory's folder is refused); the other
edge cases (``llm_call_count``, copied context, sub-agents) are in docs/interop.md.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import msgspec

from recorder.importers.common import (
    DEFAULT_CAPS,
    LIMITATION,
    ImportCaps,
    Rejected,
    RunBuilder,
    check_file,
    convert,
    read_bytes,
    read_json,
    read_jsonl,
)
from recorder.importers.values import COUNT_MAX, count, iso_ns, seconds, shown, time_ns, whole
from schemas import atif, providers
from schemas.blob import digest
from schemas.codec import ID_RE, decode_payload
from schemas.errors import SchemaError
from schemas.events import (
    UNKNOWN_ENDING,
    AssistantMessage,
    ModelCallCompleted,
    Note,
    Payload,
    RunFinished,
    RunStarted,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from schemas.providers import openai_chat
from schemas.providers.conversation import Conversation, Message, Part, Reply, json_text

NO_SIDE_EVENTS = "ATIF has no processes, file changes, network requests or submission: TASK cannot be graded"


def _text(content: atif.Content, where: str) -> str:
    """Text of a message or observation: a string, or content parts (images stay unopened)."""
    if not isinstance(content, list):
        return content or ""
    out = []
    for part in content:
        if part.type == "text":
            out.append(part.text or "")
            continue
        path = (part.source.path if part.source else None) or ""
        if path and not path.startswith(("http://", "https://")):
            p = Path(path)
            if p.is_absolute() or ".." in p.parts:
                raise Rejected(f"{where}: content path {path[:120]!r} leaves the trajectory's folder")
        out.append(f"[{part.type}]")
    return "\n".join(out)


def _sidecar(root: Path, limits: ImportCaps, b: RunBuilder) -> list[tuple[int, Payload]]:
    out: list[tuple[int, Payload]] = []
    where = shown(root / atif.SIDECAR)
    for n, line in enumerate(read_jsonl(root, root / atif.SIDECAR, limits), 1):
        kind, v, payload, ts = line.get("kind"), line.get("v"), line.get("payload"), line.get("ts_ns")
        if not isinstance(kind, str) or not isinstance(v, int) or not isinstance(ts, int):
            raise Rejected(f"{where}: line {n}: needs kind, v and ts_ns")
        time_ns(ts, f"{where}: line {n}: ts_ns", 0)
        try:
            decoded = decode_payload(kind, v, json.dumps(payload, allow_nan=False).encode())
        except (SchemaError, ValueError) as e:
            raise Rejected(f"{where}: line {n}: {e}") from e
        for ref in atif.blob_refs(decoded):
            path = root / atif.BLOB_DIR / ref.removeprefix("sha256:")
            if not path.exists():
                raise Rejected(f"{where}: line {n}: blob {ref} is not in {shown(root / atif.BLOB_DIR)}/")
            data = read_bytes(root, path, limits)
            if digest(data) != ref:
                raise Rejected(f"{shown(path)}: content does not match its name")
            b.blobs.setdefault(ref, data)
        out.append((ts, decoded))
    return out


def parse(path: Path, limits: ImportCaps = DEFAULT_CAPS) -> list[RunBuilder]:
    """One run per trajectory (and per embedded sub-agent trajectory); nothing is written."""
    path = Path(path)
    file = path / atif.TRAJECTORY if path.is_dir() else path
    root = file.parent.resolve()
    file = root / file.name
    check_file(root, file, limits)
    doc = convert(read_json(root, file, limits), atif.Trajectory, shown(file))
    file_sha = hashlib.sha256(read_bytes(root, file, limits)).hexdigest()
    source = _Source(root, limits, file_sha, file.stat().st_mtime_ns, shown(file))
    return _runs(doc, source, parent=None)


class _Source(NamedTuple):
    """The file a trajectory (and its sub-agents' trajectories) came from."""

    root: Path
    limits: ImportCaps
    sha: str
    mtime_ns: int
    origin: str


def _runs(doc: atif.Trajectory, source: _Source, parent: str | None) -> list[RunBuilder]:
    """The run of a trajectory, then those of its sub-agents (labelled with their parent)."""
    where = source.origin if parent is None else f"{source.origin} (sub-agent of {parent})"
    version = doc.schema_version or "ATIF-v1.8"
    if not version.startswith(atif.SCHEMA_PREFIX):
        raise Rejected(f"{where}: schema_version {version[:40]!r} is not ATIF v1.x")
    if not doc.steps or doc.agent is None:
        raise Rejected(f"{where}: needs an agent object and at least one step")
    run = _Run(doc, doc.agent, source, _run_id(doc, source, parent), where)
    if parent is None and _run_facts(doc).sidecar and (source.root / atif.SIDECAR).exists():
        run.side = _sidecar(source.root, source.limits, run.b)
    for i, step in enumerate(doc.steps):
        run.step(i, step)
    run.finish(version, parent)
    runs = [run.b]
    for sub in doc.subagent_trajectories:
        runs += _runs(sub, source, parent=run.b.run_id)
    return runs


def _run_id(doc: atif.Trajectory, source: _Source, parent: str | None) -> str:
    """The id an AMB export kept, else one made from the trajectory's names and the file's digest."""
    own_id = _run_facts(doc).run_id if parent is None else None
    if own_id is not None and ID_RE.match(own_id):
        return own_id
    names = f"{doc.session_id or ''}\0{doc.trajectory_id or ''}\0{source.sha}\0{parent or ''}"
    return "atif-" + hashlib.sha256(names.encode()).hexdigest()[:16]


def _run_facts(doc: atif.Trajectory) -> atif.RunFacts:
    """The trajectory's ``extra.amb``: the run an AMB export was made of (empty for others)."""
    return (doc.extra.amb if doc.extra else None) or atif.RunFacts()


def _step_facts(step: atif.Step) -> atif.StepFacts:
    """A step's ``extra.amb``: what an AMB export kept of its call (empty for others)."""
    return (step.extra.amb if step.extra else None) or atif.StepFacts()


class _Run:
    """One trajectory's import in progress: the run being built, its events waiting to be put in
    time order (``side``: the sidecar's and the run's start; ``pending``: the steps'), and the
    conversation so far, from which each agent step's request is rebuilt."""

    def __init__(self, doc: atif.Trajectory, agent: atif.Agent, source: _Source, run_id: str, where: str):
        self.doc, self.agent, self.source, self.where = doc, agent, source, where
        self.b = RunBuilder(run_id, origin=where)
        self.side: list[tuple[int, Payload]] = []
        self.pending: list[tuple[int, Payload]] = []
        self.tools = openai_chat.tools_of(agent.tool_definitions)
        self.history: list[Message] = []
        self.system: str | None = None
        self.approx = False
        self.base_ts: int | None = None
        self.call_ids = [_call_id(i, s) for i, s in enumerate(doc.steps)]

    def step(self, i: int, step: atif.Step) -> None:
        where = f"{self.where}: step {i + 1}"
        if step.source not in ("system", "user", "agent"):
            raise Rejected(f"{where}: source {str(step.source)[:20]!r} is not system, user or agent")
        text = _text(step.message, where)
        ts = iso_ns(step.timestamp, f"{where}: timestamp")
        if ts is None:
            self.approx = True
            ts = (self.base_ts if self.base_ts is not None else self.source.mtime_ns) + i * 1_000_000
        self.base_ts = self.base_ts if self.base_ts is not None else ts
        if step.is_copied_context:
            self.history.append(
                Message("assistant" if step.source == "agent" else step.source, Part.texts(text))
            )
        elif step.source == "system":
            self.system_step(i, step, text, ts)
        elif step.source == "user":
            self.history.append(Message("user", Part.texts(text)))
        else:
            self.agent_step(i, step, text, ts, where)

    def system_step(self, i: int, step: atif.Step, text: str, ts: int) -> None:
        """The first system step before any message is the system prompt; later ones are notes."""
        if self.system is None and not self.history:
            self.system = text
        else:
            self.pending.append((ts, Note(text=text, data={"kind": "atif.system_step", "step_id": i + 1})))
        if step.observation is not None and step.observation.results:
            observation = msgspec.to_builtins(step.observation)
            data = {"kind": "atif.observation", "observation": observation}
            self.pending.append((ts, Note(text="system step observation", data=data)))

    def agent_step(self, i: int, step: atif.Step, text: str, ts: int, where: str) -> None:
        facts = _step_facts(step)
        call_id = self.call_ids[i] or f"s{i + 1:04d}"
        at = time_ns(facts.ts_ns, f"{where}: extra.amb.ts_ns", ts)
        parts = _tool_calls(step, call_id, facts.raw_arguments or {})
        reasoning = step.reasoning_content or ""
        message = AssistantMessage(text=text, reasoning=reasoning, tool_calls=parts)
        if step.llm_call_count != 0:
            self.model_call(i, step, message, facts.call or atif.CallFacts(), at, ts, where)
        self.tool_requests(parts, facts.requested, at, call_id, where)
        self.history.append(
            Message("assistant", Part.texts(text) + [Part.call(t.id, t.name, t.arguments) for t in parts])
        )
        next_call = next((c for c in self.call_ids[i + 1 :] if c), call_id)
        self.observations(i, step, parts, facts.results or [], at, next_call)

    def model_call(
        self,
        i: int,
        step: atif.Step,
        message: AssistantMessage,
        call: atif.CallFacts,
        at: int,
        ts: int,
        where: str,
    ) -> None:
        """The model call an agent step stands for, its request and response rebuilt (synthetic)."""
        call_id = self.call_ids[i] or f"s{i + 1:04d}"
        model = step.model_name if step.model_name is not None else self.agent.model_name
        usage = _usage(step.metrics, where)
        api = providers.APIS.get(call.api) or providers.CHAT  # the body's shape
        head = [Message("system", Part.texts(self.system))] if self.system is not None else []
        request = api.module.build_request(Conversation(head + self.history, self.tools, model))
        reply = Reply(message, model, call.stop_reason, usage, f"{self.b.run_id}-{call_id}")
        response = api.module.build_response(reply)
        field = f"{where}: extra.amb.call"
        completed = ModelCallCompleted(
            call_id=call_id,
            provider=call.provider,
            api=call.api,
            model=model,
            stream=call.stream,
            url=call.url,
            status=call.status,
            ok=call.ok,
            error=call.error,
            request=self.b.json_blob(request),
            response=self.b.json_blob(response),
            message=message,
            stop_reason=call.stop_reason,
            usage=usage,
            started_ns=time_ns(call.started_ns, f"{field}.started_ns", ts),
            ttfb_ms=seconds(call.ttfb_ms, f"{field}.ttfb_ms"),
            latency_ms=seconds(call.latency_ms, f"{field}.latency_ms"),
            retries=count(call.retries, f"{field}.retries"),
            partial=call.partial,
        )
        self.pending.append((at, completed))
        n = step.llm_call_count
        if isinstance(n, int) and n > 1:
            data = {"kind": "atif.llm_call_count", "llm_call_count": n}
            self.pending.append((at, Note(text=f"usage of step {i + 1} sums {n} model calls", data=data)))

    def tool_requests(
        self,
        parts: list[ToolCallPart],
        requested: dict[str, atif.Requested] | None,
        at: int,
        call_id: str,
        where: str,
    ) -> None:
        """A request per tool call (only those an AMB export says were requested, at their time)."""
        for t in parts:
            when = at
            if requested is not None:
                if t.id not in requested:
                    continue
                when = time_ns(requested[t.id].ts_ns, f"{where}: extra.amb.requested.ts_ns", at)
            self.pending.append((when, ToolCallRequested(t.id, t.name, t.arguments, model_call_id=call_id)))

    def observations(
        self,
        i: int,
        step: atif.Step,
        parts: list[ToolCallPart],
        facts_list: list[atif.ResultFacts],
        at: int,
        next_call: str,
    ) -> None:
        """A tool result per observation result answering a call; a note for any other."""
        where = f"{self.where}: step {i + 1}"
        names = {t.id: t.name for t in parts}
        results = step.observation.results if step.observation is not None else []
        for k, res in enumerate(results):
            content = _text(res.content, f"{where} observation {k + 1}")
            facts = facts_list[k] if k < len(facts_list) else atif.ResultFacts()
            res_at = time_ns(facts.ts_ns, f"{where}: extra.amb.results[{k}].ts_ns", at)
            if res.source_call_id is None:
                note = Note(text=content[:2000], data={"kind": "atif.observation", "step_id": i + 1})
                self.pending.append((res_at, note))
                continue
            source_id = str(res.source_call_id)
            inline = whole(facts.inline_chars, f"{where}: extra.amb.results[{k}].inline_chars", 0, COUNT_MAX)
            output, blob = content, None
            if inline is not None:
                output, blob = content[:inline], self.b.blob(content.encode(), "text/plain")
            result = ToolCallResult(
                tool_call_id=source_id,
                model_call_id=facts.model_call_id or next_call,
                name=facts.name if facts.name is not None else names.get(source_id),
                output=output,
                output_blob=blob,
                is_error=facts.is_error,
            )
            self.pending.append((res_at, result))
            self.history.append(Message("tool", [Part.result(content, source_id)]))

    def finish(self, version: str, parent: str | None) -> None:
        """Emit every event in time order between the run's start and its (unknown) end."""
        # The run starts at its earliest step: a step dated before the first one is not put before it.
        base = self.base_ts if self.base_ts is not None else self.source.mtime_ns
        start_ts = min([base] + [ts for ts, _ in self.pending])
        if not any(isinstance(p, RunStarted) for _, p in self.side):
            self.side += [(start_ts, p) for p in self.start(version, parent)]
        everything = sorted(
            self.side + self.pending,
            key=lambda tp: (tp[0], not isinstance(tp[1], RunStarted), isinstance(tp[1], RunFinished)),
        )
        for ts, payload in everything:
            self.b.emit(payload, ts)
        if not any(isinstance(p, RunFinished) for _, p in self.side):
            # ATIF keeps no end: the run lasted as long as its steps span, and how it ended is unknown.
            b = self.b
            reason = "imported from ATIF: the format does not say how the run ended"
            b.emit(
                RunFinished(status=UNKNOWN_ENDING, duration_s=(b.last_ts - start_ts) / 1e9, reason=reason),
                b.last_ts,
            )

    def start(self, version: str, parent: str | None) -> list[Payload]:
        """The run's start and the limitations of a trajectory that was not exported by AMB."""
        time_base = "approx" if self.approx else "exact"
        labels = {"origin": "atif", "schema_version": version, "time_base": time_base}
        if self.doc.session_id:
            labels["atif_session_id"] = self.doc.session_id
        if parent:
            labels["parent_run"] = parent
        out: list[Payload] = [
            RunStarted(
                agent=self.agent.name or "unknown",
                model=self.agent.model_name,
                backend="import",
                labels=labels,
                tool_versions={self.agent.name or "agent": self.agent.version or ""},
            ),
            Note(text=NO_SIDE_EVENTS, data={"kind": LIMITATION, "limitation": "no_side_events"}),
        ]
        if self.approx:
            text = "steps without timestamps: the file's time plus 1 ms per step"
            out.append(Note(text=text, data={"kind": LIMITATION, "limitation": "approximate_clock"}))
        return out


def _call_id(i: int, step: atif.Step) -> str | None:
    """The model call id an AMB export kept for the step, else one made from its place; None for a
    step that is no model call."""
    if step.source != "agent" or step.is_copied_context:
        return None
    return _step_facts(step).call_id or f"s{i + 1:04d}"


def _tool_calls(step: atif.Step, call_id: str, raw_args: dict[str, str]) -> list[ToolCallPart]:
    """The step's tool calls, each with the raw argument string an AMB export kept, else its
    arguments object as compact JSON."""
    parts: list[ToolCallPart] = []
    for j, tc in enumerate(step.tool_calls or []):
        tc_id = tc.tool_call_id or f"{call_id}_{j}"
        raw = raw_args.get(tc_id)
        args = raw if raw is not None else json_text(tc.arguments)
        parts.append(ToolCallPart(id=tc_id, name=tc.function_name or "", arguments=args))
    return parts


def _usage(metrics: atif.Metrics | None, where: str) -> Usage:
    """A step's token counts, each checked as a count (``values.count``) naming its field."""
    m = metrics or atif.Metrics()
    extra = m.extra or atif.TokenExtra()
    return Usage(
        input_total=count(m.prompt_tokens, f"{where}: metrics.prompt_tokens"),
        cache_read=count(m.cached_tokens, f"{where}: metrics.cached_tokens"),
        cache_write=count(extra.cache_write_tokens, f"{where}: metrics.extra.cache_write_tokens"),
        output=count(m.completion_tokens, f"{where}: metrics.completion_tokens"),
        reasoning=count(extra.reasoning_tokens, f"{where}: metrics.extra.reasoning_tokens"),
        reported=extra.reported if extra.reported is not None else metrics is not None,
    )
