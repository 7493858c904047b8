"""ATIF trajectories (Harbor's format, v1.0-v1.8) as AMB runs.

Agent steps become ``model_call.completed`` (request and response bodies rebuilt from the steps,
marked synthetic), ``tool_call.requested`` per tool call and ``tool_call.result`` per observation
result; system and user steps become the rebuilt requests' history. A trajectory written by
``amb export atif`` carries ``step.extra.amb`` (exact timestamps, call facts, raw argument strings)
and a sidecar ``events.jsonl`` (everything ATIF has no slot for, with its blobs under ``blobs/``):
both are read back, so such a run comes back as it was exported (same run id, same facts).

Edge cases: ``llm_call_count == 0`` steps are deterministic dispatches (tool events, no model call);
``llm_call_count > 1`` gives one model call and a note that its usage sums N calls; copied-context
steps are history only; embedded sub-agent trajectories become their own runs labelled
``parent_run``; content parts that are images are never opened (their path is refused if it leaves
the trajectory's folder) and stand as ``[image]`` in the text.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from recorder.importers.common import (
    DEFAULT_CAPS,
    LIMITATION,
    SYNTHETIC_JSON,
    ImportCaps,
    Rejected,
    RunBuilder,
    as_dict,
    as_list,
    check_file,
    read_bytes,
    read_json,
    read_jsonl,
)
from recorder.importers.values import count, datetime_ns, seconds, shown, time_ns
from schemas import providers
from schemas.blob import digest
from schemas.codec import ID_RE, decode_payload, encode_payload
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
from schemas.providers.conversation import Conversation, Message, Part, Reply

TRAJECTORY = "trajectory.json"
SIDECAR = "events.jsonl"
BLOB_DIR = "blobs"


def _text(root: Path, content: Any, where: str) -> str:
    """Text of a message or observation: a string, or content parts (images stay unopened)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict):
                raise Rejected(f"{where}: a content part is not an object")
            if part.get("type") == "text":
                out.append(str(part.get("text") or ""))
            else:
                source = as_dict(part.get("source"))
                path = str(source.get("path") or "")
                if path and not path.startswith(("http://", "https://")):
                    p = Path(path)
                    if p.is_absolute() or ".." in p.parts:
                        raise Rejected(f"{where}: content path {path[:120]!r} leaves the trajectory's folder")
                out.append(f"[{part.get('type')}]")
        return "\n".join(out)
    raise Rejected(f"{where}: message is neither text nor content parts")


def _ns(stamp: Any, where: str) -> int | None:
    """A step's ISO 8601 timestamp in ns since 1970; None when it has none the clock can place
    (absent, not a time, no time zone); refused when it is a time outside what a run holds."""
    if not isinstance(stamp, str):
        return None
    try:
        dt = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None
    return datetime_ns(dt, f"{where}: timestamp")


def _sidecar(root: Path, limits: ImportCaps, b: RunBuilder) -> list[tuple[int, Payload]]:
    out: list[tuple[int, Payload]] = []
    where = shown(root / SIDECAR)
    for n, line in enumerate(read_jsonl(root, root / SIDECAR, limits), 1):
        kind, v, payload, ts = line.get("kind"), line.get("v"), line.get("payload"), line.get("ts_ns")
        if not isinstance(kind, str) or not isinstance(v, int) or not isinstance(ts, int):
            raise Rejected(f"{where}: line {n}: needs kind, v and ts_ns")
        time_ns(ts, f"{where}: line {n}: ts_ns", 0)
        try:
            decoded = decode_payload(kind, v, json.dumps(payload, allow_nan=False).encode())
        except (SchemaError, ValueError) as e:
            raise Rejected(f"{where}: line {n}: {e}") from e
        for ref in (m.decode() for m in BLOB_REF.findall(encode_payload(decoded))):
            hexd = ref.removeprefix("sha256:")
            path = root / BLOB_DIR / hexd
            if not path.exists():
                raise Rejected(f"{where}: line {n}: blob {ref} is not in {shown(root / BLOB_DIR)}/")
            data = read_bytes(root, path, limits)
            if digest(data) != ref:
                raise Rejected(f"{shown(path)}: content does not match its name")
            b.blobs.setdefault(ref, data)
        out.append((ts, decoded))
    return out


BLOB_REF = re.compile(rb'"blob":"(sha256:[0-9a-f]{64})"')
"""Every blob reference in a canonical payload, as ``amb verify`` finds them."""


def parse(path: Path, limits: ImportCaps = DEFAULT_CAPS) -> list[RunBuilder]:
    """One run per trajectory (and per embedded sub-agent trajectory); nothing is written."""
    path = Path(path)
    file = path / TRAJECTORY if path.is_dir() else path
    root = file.parent.resolve()
    file = root / file.name
    check_file(root, file, limits)
    doc = read_json(root, file, limits)
    file_sha = hashlib.sha256(read_bytes(root, file, limits)).hexdigest()
    return _trajectory(
        doc, root, limits, file_sha, parent=None, mtime_ns=file.stat().st_mtime_ns, origin=shown(file)
    )


def _trajectory(
    doc: Any, root: Path, limits: ImportCaps, file_sha: str, parent: str | None, mtime_ns: int, origin: str
) -> list[RunBuilder]:
    where = origin if parent is None else f"{origin} (sub-agent of {parent})"
    if not isinstance(doc, dict):
        raise Rejected(f"{where}: not a JSON object")
    version = doc.get("schema_version", "ATIF-v1.8")
    if not isinstance(version, str) or not version.startswith("ATIF-v1."):
        raise Rejected(f"{where}: schema_version {str(version)[:40]!r} is not ATIF v1.x")
    steps, agent = doc.get("steps"), doc.get("agent")
    if not isinstance(steps, list) or not steps or not isinstance(agent, dict):
        raise Rejected(f"{where}: needs an agent object and at least one step")
    extra = as_dict(doc.get("extra"))
    amb_root = as_dict(extra.get("amb"))
    session = str(doc.get("session_id") or "")
    own_id = amb_root.get("run_id") if parent is None else None
    if isinstance(own_id, str) and ID_RE.match(own_id):
        run_id = own_id
    else:
        h = hashlib.sha256(
            f"{session}\0{doc.get('trajectory_id') or ''}\0{file_sha}\0{parent or ''}".encode()
        )
        run_id = "atif-" + h.hexdigest()[:16]
    b = RunBuilder(run_id, origin=where)
    side: list[tuple[int, Payload]] = []
    if parent is None and amb_root.get("sidecar") and (root / SIDECAR).exists():
        side = _sidecar(root, limits, b)
    pending: list[tuple[int, Payload]] = []
    model = agent.get("model_name") if isinstance(agent.get("model_name"), str) else None
    tools = openai_chat.tools_of(agent.get("tool_definitions"))
    history: list[Message] = []
    system: str | None = None
    approx = False
    call_ids: list[str | None] = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise Rejected(f"{where}: step {i + 1} is not an object")
        amb = (step.get("extra") or {}).get("amb") if isinstance(step.get("extra"), dict) else None
        cid = amb.get("call_id") if isinstance(amb, dict) else None
        call_ids.append(
            (str(cid) if cid else f"s{i + 1:04d}")
            if step.get("source") == "agent" and not step.get("is_copied_context")
            else None
        )
    base_ts: int | None = None
    for i, step in enumerate(steps):
        swhere = f"{where}: step {i + 1}"
        source = step.get("source")
        if source not in ("system", "user", "agent"):
            raise Rejected(f"{swhere}: source {str(source)[:20]!r} is not system, user or agent")
        text = _text(root, step.get("message"), swhere)
        ts = _ns(step.get("timestamp"), swhere)
        if ts is None:
            approx = True
            ts = (base_ts if base_ts is not None else mtime_ns) + i * 1_000_000
        base_ts = base_ts if base_ts is not None else ts
        if step.get("is_copied_context"):
            history.append(Message("assistant" if source == "agent" else source, Part.texts(text)))
            continue
        if source == "system":
            if system is None and not history:
                system = text
            else:
                pending.append((ts, Note(text=text, data={"kind": "atif.system_step", "step_id": i + 1})))
            obs = step.get("observation")
            if isinstance(obs, dict) and obs.get("results"):
                pending.append(
                    (
                        ts,
                        Note(
                            text="system step observation",
                            data={"kind": "atif.observation", "observation": obs},
                        ),
                    )
                )
            continue
        if source == "user":
            history.append(Message("user", Part.texts(text)))
            continue
        amb = (
            step["extra"]["amb"]
            if isinstance(step.get("extra"), dict) and isinstance(step["extra"].get("amb"), dict)
            else {}
        )
        call = as_dict(amb.get("call"))
        call_id = call_ids[i] or f"s{i + 1:04d}"
        at = time_ns(amb.get("ts_ns"), f"{swhere}: extra.amb.ts_ns", ts)
        raw_args = as_dict(amb.get("raw_arguments"))
        parts: list[ToolCallPart] = []
        for j, tc in enumerate(step.get("tool_calls") or []):
            if not isinstance(tc, dict) or not isinstance(tc.get("arguments", {}), dict):
                raise Rejected(f"{swhere}: tool call {j + 1} needs an arguments object")
            tc_id = str(tc.get("tool_call_id") or f"{call_id}_{j}")
            raw = raw_args.get(tc_id)
            args = (
                raw
                if isinstance(raw, str)
                else json.dumps(tc.get("arguments") or {}, separators=(",", ":"), ensure_ascii=False)
            )
            parts.append(ToolCallPart(id=tc_id, name=str(tc.get("function_name") or ""), arguments=args))
        metrics = step.get("metrics") if isinstance(step.get("metrics"), dict) else None
        mextra = metrics.get("extra") if metrics and isinstance(metrics.get("extra"), dict) else {}
        m = metrics or {}
        usage = Usage(
            input_total=count(m.get("prompt_tokens"), f"{swhere}: metrics.prompt_tokens"),
            cache_read=count(m.get("cached_tokens"), f"{swhere}: metrics.cached_tokens"),
            cache_write=count(
                mextra.get("cache_write_tokens"), f"{swhere}: metrics.extra.cache_write_tokens"
            ),
            output=count(m.get("completion_tokens"), f"{swhere}: metrics.completion_tokens"),
            reasoning=count(mextra.get("reasoning_tokens"), f"{swhere}: metrics.extra.reasoning_tokens"),
            reported=bool(mextra.get("reported", metrics is not None)),
        )
        step_model = step.get("model_name") if isinstance(step.get("model_name"), str) else model
        reasoning = step.get("reasoning_content") if isinstance(step.get("reasoning_content"), str) else ""
        llm_calls = step.get("llm_call_count")
        stop = call.get("stop_reason")
        message = AssistantMessage(text=text, reasoning=reasoning, tool_calls=parts)
        if llm_calls != 0:
            api = providers.APIS.get(str(call.get("api"))) or providers.CHAT  # the body's shape
            head = [Message("system", Part.texts(system))] if system is not None else []
            request = api.module.build_request(Conversation(head + history, tools, step_model))
            stop_reason = stop if isinstance(stop, str) else None
            response = api.module.build_response(
                Reply(message, step_model, stop_reason, usage, f"{run_id}-{call_id}")
            )
            pending.append(
                (
                    at,
                    ModelCallCompleted(
                        call_id=call_id,
                        provider=str(call.get("provider") or "openai"),
                        api=str(call.get("api") or "chat.completions"),
                        model=step_model,
                        stream=bool(call.get("stream", False)),
                        url=str(call.get("url") or ""),
                        status=call.get("status") if isinstance(call.get("status"), int) else 200,
                        ok=bool(call.get("ok", True)),
                        error=call.get("error") if isinstance(call.get("error"), str) else None,
                        request=b.json_blob(request, SYNTHETIC_JSON),
                        response=b.json_blob(response, SYNTHETIC_JSON),
                        message=message,
                        stop_reason=stop_reason,
                        usage=usage,
                        started_ns=time_ns(
                            call.get("started_ns"), f"{swhere}: extra.amb.call.started_ns", ts
                        ),
                        ttfb_ms=seconds(call.get("ttfb_ms"), f"{swhere}: extra.amb.call.ttfb_ms"),
                        latency_ms=seconds(call.get("latency_ms"), f"{swhere}: extra.amb.call.latency_ms"),
                        retries=count(call.get("retries"), f"{swhere}: extra.amb.call.retries"),
                        partial=bool(call.get("partial", False)),
                    ),
                )
            )
            if isinstance(llm_calls, int) and llm_calls > 1:
                pending.append(
                    (
                        at,
                        Note(
                            text=f"usage of step {i + 1} sums {llm_calls} model calls",
                            data={"kind": "atif.llm_call_count", "llm_call_count": llm_calls},
                        ),
                    )
                )
        requested = amb.get("requested") if isinstance(amb.get("requested"), dict) else None
        for t in parts:
            if requested is None or t.id in requested:
                rts = (
                    time_ns(as_dict(requested[t.id]).get("ts_ns"), f"{swhere}: extra.amb.requested.ts_ns", at)
                    if requested
                    else at
                )
                pending.append(
                    (
                        rts,
                        ToolCallRequested(
                            tool_call_id=t.id, name=t.name, arguments=t.arguments, model_call_id=call_id
                        ),
                    )
                )
        history.append(
            Message("assistant", Part.texts(text) + [Part.call(t.id, t.name, t.arguments) for t in parts])
        )
        next_call = next((c for c in call_ids[i + 1 :] if c), call_id)
        obs = as_dict(step.get("observation"))
        facts_list = as_list(amb.get("results"))
        names = {t.id: t.name for t in parts}
        for k, res in enumerate(obs.get("results") or []):
            if not isinstance(res, dict):
                raise Rejected(f"{swhere}: observation result {k + 1} is not an object")
            content = _text(root, res.get("content"), f"{swhere} observation {k + 1}")
            source_id = res.get("source_call_id")
            facts = as_dict(facts_list[k]) if k < len(facts_list) else {}
            inline = facts.get("inline_chars")
            output, blob = content, None
            if isinstance(inline, int):
                output, blob = content[:inline], b.blob(content.encode(), "text/plain")
            res_at = time_ns(facts.get("ts_ns"), f"{swhere}: extra.amb.results[{k}].ts_ns", at)
            if source_id is None:
                pending.append(
                    (
                        res_at,
                        Note(text=content[:2000], data={"kind": "atif.observation", "step_id": i + 1}),
                    )
                )
                continue
            pending.append(
                (
                    res_at,
                    ToolCallResult(
                        tool_call_id=str(source_id),
                        model_call_id=str(facts.get("model_call_id") or next_call),
                        name=facts.get("name")
                        if isinstance(facts.get("name"), str)
                        else names.get(str(source_id)),
                        output=output,
                        output_blob=blob,
                        is_error=facts.get("is_error") if isinstance(facts.get("is_error"), bool) else None,
                    ),
                )
            )
            history.append(Message("tool", [Part.result(content, source_id)]))
    # The run starts at its earliest step: a step dated before the first one is not put before it.
    start_ts = min([ts for ts, _ in pending], default=base_ts if base_ts is not None else mtime_ns)
    if base_ts is not None:
        start_ts = min(start_ts, base_ts)
    if not any(isinstance(p, RunStarted) for _, p in side):
        labels = {"origin": "atif", "schema_version": version, "time_base": "approx" if approx else "exact"}
        if session:
            labels["atif_session_id"] = session
        if parent:
            labels["parent_run"] = parent
        side.append(
            (
                start_ts,
                RunStarted(
                    agent=str(agent.get("name") or "unknown"),
                    model=model,
                    backend="import",
                    labels=labels,
                    tool_versions={str(agent.get("name") or "agent"): str(agent.get("version") or "")},
                ),
            )
        )
        note = "ATIF has no processes, file changes, network requests or submission: TASK cannot be graded"
        side.append((start_ts, Note(text=note, data={"kind": LIMITATION, "limitation": "no_side_events"})))
        if approx:
            side.append(
                (
                    start_ts,
                    Note(
                        text="steps without timestamps: the file's time plus 1 ms per step",
                        data={"kind": LIMITATION, "limitation": "approximate_clock"},
                    ),
                )
            )
    everything = sorted(
        side + pending,
        key=lambda tp: (tp[0], not isinstance(tp[1], RunStarted), isinstance(tp[1], RunFinished)),
    )
    for ts, payload in everything:
        b.emit(payload, ts)
    if not any(isinstance(p, RunFinished) for _, p in side):
        # ATIF keeps no end: the run lasted as long as its steps span, and how it ended is unknown.
        b.emit(
            RunFinished(
                status=UNKNOWN_ENDING,
                duration_s=(b.last_ts - start_ts) / 1e9,
                reason="imported from ATIF: the format does not say how the run ended",
            ),
            b.last_ts,
        )
    runs = [b]
    for sub in doc.get("subagent_trajectories") or []:
        runs += _trajectory(sub, root, limits, file_sha, parent=run_id, mtime_ns=mtime_ns, origin=origin)
    return runs
