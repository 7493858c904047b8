"""AutoMedBench's model calls, rebuilt: the API call records each branch counted, paired with the
assistant messages of the saved conversation, as ``model_call.completed`` events with request and
response bodies rebuilt through the provider layer (the source's messages are OpenAI Chat's), the
tool calls each asked for, the results each next request carried, and the code executions logged
in the same turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from recorder.importers.common import ImportCaps, RunBuilder, as_dict, read_jsonl
from recorder.importers.values import COUNT_MAX, count, seconds, shown, whole
from schemas.events import (
    AssistantMessage,
    ModelCallCompleted,
    ProcessExited,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from schemas.providers import openai_chat
from schemas.providers.conversation import Conversation, Message, Part, Reply, Tool
from schemas.untrusted_json import loads_untrusted

NS = 1_000_000_000

Row = dict[str, Any]
"""A record of a JSON-lines file (trace, tool log) or a message of the conversation: five
harnesses wrote them with fields that vary, so they stay objects and each number is checked
(``values``) where it is read."""


class Call(NamedTuple):
    """One API call as the source counted it: relative time, tokens, finish reason, text preview."""

    ts: float | None
    input: int | None
    output: int | None
    finish: str | None
    preview: str
    api_s: float | None
    turn: int | None


def records(root: Path, path: Path, limits: ImportCaps) -> list[tuple[str, Row]]:
    """The records of a JSON-lines file, each with where it is (``FILE: record N``) for messages."""
    where = shown(path)
    return [(f"{where}: record {i}", rec) for i, rec in enumerate(read_jsonl(root, path, limits), 1)]


def turn_of(rec: Row, where: str) -> int | None:
    return whole(rec.get("turn"), f"{where}: turn", 0, COUNT_MAX)


def _tokens(rec: Row, key: str, where: str) -> int | None:
    """A token count of a record (None when it has none); a value that is no count refuses the input."""
    return None if rec.get(key) is None else count(rec.get(key), f"{where}: {key}")


def _call(rec: Row, where: str, ts: float | None, tokens_in: int | None, tokens_out: int | None) -> Call:
    finish = rec.get("finish_reason")
    return Call(
        ts,
        tokens_in,
        tokens_out,
        finish if isinstance(finish, str) else None,
        str(rec.get("content") or rec.get("content_preview") or ""),
        seconds(rec.get("api_s"), f"{where}: api_s"),
        turn_of(rec, where),
    )


def read_calls(branch: str, root: Path, process: Path, limits: ImportCaps) -> list[Call]:
    """The API calls the source counted: ``api_call`` trace records; in report, the lines of
    ``api_responses.jsonl``; in enhancement, every trace line (its token counts running totals)."""
    trace = records(root, process / "trace.jsonl", limits) if (process / "trace.jsonl").is_file() else []
    if branch == "report":
        out = []
        for where, line in records(root, process / "api_responses.jsonl", limits):
            resp, where = as_dict(line.get("response")), f"{where}: response"
            tokens = _tokens(resp, "input_tokens", where), _tokens(resp, "output_tokens", where)
            rec = {"finish_reason": resp.get("finish_reason"), "content": resp.get("content")}
            out.append(_call(rec, where, None, *tokens))
        return out
    if branch == "enhancement":
        out, prev_in, prev_out = [], 0, 0
        for where, rec in trace:
            tin, tout = _tokens(rec, "prompt_tokens", where), _tokens(rec, "completion_tokens", where)
            din = None if tin is None else tin - prev_in
            dout = None if tout is None else tout - prev_out
            prev_in, prev_out = tin or prev_in, tout or prev_out
            out.append(_call(rec, where, seconds(rec.get("ts"), f"{where}: ts"), din, dout))
        return out
    return [
        _call(
            rec,
            where,
            seconds(rec.get("ts"), f"{where}: ts"),
            _tokens(rec, "input_tokens", where),
            _tokens(rec, "output_tokens", where),
        )
        for where, rec in trace
        if rec.get("type") == "api_call"
    ]


def by_turn(tool_rows: list[Row]) -> dict[int, list[Row]]:
    """The tool log's rows by the turn that logged them (turns are checked when the log is read)."""
    out: dict[int, list[Row]] = {}
    for row in tool_rows:
        if row.get("turn") is not None:
            out.setdefault(int(row["turn"]), []).append(row)
    return out


def messages_without_conversation(calls: list[Call], tool_rows: list[Row]) -> list[Row]:
    """A conversation rebuilt from the trace and the tool log (the conversation file was never written)."""
    rows_by_turn = by_turn(tool_rows)
    messages: list[Row] = []
    for k, call in enumerate(calls):
        turn = call.turn or k + 1
        tcs, results = [], []
        for i, row in enumerate(rows_by_turn.get(turn, [])):
            tc_id = f"import_{turn}_{i}"
            name = str(row.get("tool") or row.get("name") or "unknown")
            args = as_dict(row.get("arguments"))
            if not args and ("code" in row or "language" in row):
                args = {"language": row.get("language"), "code": row.get("code")}
            function = {"name": name, "arguments": json.dumps(args)}
            tcs.append({"id": tc_id, "type": "function", "function": function})
            results.append({"role": "tool", "tool_call_id": tc_id, "content": json.dumps(row.get("result"))})
        msg: Row = {"role": "assistant", "content": call.preview or None}
        if tcs:
            msg["tool_calls"] = tcs
        messages.append(msg)
        messages.extend(results)
    return messages


def check_process_numbers(row: Row, where: str) -> None:
    """Refuse a tool-log row whose code execution's numbers are no facts (checked once, when read)."""
    result = row.get("result")
    if isinstance(result, dict):
        whole(result.get("exit_code"), f"{where}: result.exit_code", -(1 << 31), (1 << 31) - 1)
    for key in ("exec_time_s", "elapsed_s", "ts"):
        seconds(row.get(key), f"{where}: {key}")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return ""


def _reasoning(msg: Row) -> str:
    details = msg.get("reasoning_details")
    if isinstance(details, str):
        return details
    if isinstance(details, list):
        out = [str(d.get("text") or d.get("summary") or "") for d in details if isinstance(d, dict)]
        return "\n".join(x for x in out if x)
    return ""


def _is_error(content: str) -> bool:
    stripped = content.strip()
    if stripped.startswith(("BLOCKED", "REJECTED", "TIMEOUT")):
        return True
    try:
        data = loads_untrusted(stripped)  # an agent's tool output: nested deep, it is just text
    except ValueError:
        return False
    if isinstance(data, dict):
        code = data.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool):
            return code != 0
        return "error" in data
    return False


def _tool_calls(msg: Row | None, call_id: str) -> list[ToolCallPart]:
    tcs: list[ToolCallPart] = []
    for tc in (msg.get("tool_calls") or []) if msg else []:
        if not isinstance(tc, dict):
            continue
        fn = as_dict(tc.get("function"))
        raw = fn.get("arguments")
        args = raw if isinstance(raw, str) else json.dumps(raw if raw is not None else {})
        tc_id = str(tc.get("id") or f"{call_id}_{len(tcs)}")
        tcs.append(ToolCallPart(id=tc_id, name=str(fn.get("name") or ""), arguments=args))
    return tcs


def _limitations(b: RunBuilder, branch: str, calls: int, answers: int) -> None:
    """What the pairing of API calls and assistant messages could not find."""
    if calls > answers:
        b.limitation(
            "missing_last_assistant_turn",
            f"{calls - answers} API call(s) have no assistant message in the conversation "
            "(the source stops before saving a final answer without tool calls); their text is the "
            f"{300 if branch != 'report' else 'full'}-character preview from trace.jsonl",
            calls=calls - answers,
        )
    if answers > calls:
        b.limitation(
            "missing_token_counts",
            f"{answers - calls} assistant message(s) have no API call record; their token counts are unknown",
        )


class CallEmitter:
    """The k-th API call paired with the k-th assistant message, emitted in order. A tool result
    waits (``pending``) until the request that carries it, and is emitted just before that call."""

    def __init__(
        self,
        b: RunBuilder,
        branch: str,
        messages: list[Row],
        system: str | None,
        model: str | None,
        anchor: int,
    ):
        self.b, self.branch, self.messages, self.model, self.anchor = b, branch, messages, model, anchor
        self.head = [Message("system", Part.texts(system))] if system is not None else []
        names = {
            str(tc.get("function", {}).get("name"))
            for m in messages
            for tc in m.get("tool_calls") or []
            if isinstance(tc, dict) and isinstance(tc.get("function"), dict)
        }
        self.tools = [Tool(name) for name in sorted(names)]
        self.pending: list[tuple[Row, str]] = []
        self.names: dict[str, str] = {}
        self.last_ts = anchor

    def emit_all(self, calls: list[Call], tool_rows: list[Row]) -> None:
        assistant_at = [i for i, m in enumerate(self.messages) if m.get("role") == "assistant"]
        _limitations(self.b, self.branch, len(calls), len(assistant_at))
        rows_by_turn = by_turn(tool_rows)
        for k in range(max(len(calls), len(assistant_at))):
            call = calls[k] if k < len(calls) else None
            at = assistant_at[k] if k < len(assistant_at) else None
            ts = self.call(f"c{k + 1:04d}", call, at)
            # VQA numbers tool rows by the next code run, not by the API call: they cannot be paired.
            if self.branch != "vqa" and call is not None and call.turn is not None:
                for row in rows_by_turn.get(call.turn, []):
                    _emit_process(self.b, row, self.anchor, ts)
        # Results no later request carried (the last submit, a cut-off run): still the harness's facts.
        for tmsg, asked_by in self.pending:
            self.result(tmsg, asked_by, self.b.last_ts)

    def call(self, call_id: str, call: Call | None, at: int | None) -> int:
        """Emit one model call and the tool calls it asked for; its time."""
        msg = self.messages[at] if at is not None else None
        history = self.messages[:at] if at is not None else self.messages
        ts = (
            self.anchor + int(call.ts * NS)
            if call is not None and call.ts is not None
            else self.last_ts + 1_000_000
        )
        latency = call.api_s * 1000 if call is not None and call.api_s is not None else None
        started = ts - int(latency * 1e6) if latency is not None else ts
        self.carry(call_id, history, started)
        text = _text(msg.get("content")) if msg else (call.preview if call else "")
        tcs = _tool_calls(msg, call_id)
        finish = call.finish if call is not None else None
        said = openai_chat.conversation({"messages": history}).messages  # the source's are Chat's
        request = openai_chat.build_request(Conversation(self.head + said, self.tools, self.model))
        message = AssistantMessage(text=text, reasoning=_reasoning(msg) if msg else "", tool_calls=tcs)
        usage = Usage(
            input_total=(call.input or 0) if call else 0,
            output=(call.output or 0) if call else 0,
            reported=call is not None and call.input is not None,
        )
        reply = Reply(
            message, self.model, finish, usage if usage.reported else None, f"{self.b.run_id}-{call_id}"
        )
        completed = ModelCallCompleted(
            call_id=call_id,
            provider="openai",
            api="chat.completions",
            model=self.model,
            status=200,
            request=self.b.json_blob(request),
            response=self.b.json_blob(openai_chat.build_response(reply)),
            message=message,
            stop_reason=finish,
            usage=usage,
            started_ns=started,
            latency_ms=latency,
            partial=msg is None,
        )
        self.last_ts = self.b.emit(completed, ts)
        for t in tcs:
            self.b.emit(ToolCallRequested(t.id, t.name, t.arguments, model_call_id=call_id), ts)
            self.names[t.id] = t.name
        if at is not None:
            j = at + 1
            while j < len(self.messages) and self.messages[j].get("role") == "tool":
                self.pending.append((self.messages[j], call_id))
                j += 1
        return ts

    def carry(self, call_id: str, history: list[Row], started: int) -> None:
        """Emit the waiting results that this call's request carries."""
        carried = {m.get("tool_call_id") for m in history if m.get("role") == "tool"}
        still = []
        for tmsg, asked_by in self.pending:
            if tmsg.get("tool_call_id") in carried:
                self.result(tmsg, call_id, started)
            else:
                still.append((tmsg, asked_by))
        self.pending = still

    def result(self, tmsg: Row, carried_by: str, ts: int) -> None:
        tc_id = str(tmsg.get("tool_call_id") or "")
        content = _text(tmsg.get("content"))
        result = ToolCallResult(
            tool_call_id=tc_id,
            model_call_id=carried_by,
            name=self.names.get(tc_id),
            output=content,
            is_error=_is_error(content),
        )
        self.b.emit(result, ts)


def _checked(x: Any) -> float | None:
    """A number ``check_process_numbers`` checked (None stays None)."""
    return None if x is None else float(x)


def _emit_process(b: RunBuilder, row: Row, anchor: int, call_ts: int) -> None:
    """A code execution the tool log kept, as the process it ran."""
    name = row.get("tool") or row.get("name")
    if name not in ("execute_code", None) and "code" not in row:
        return
    args = as_dict(row.get("arguments")) or row
    language = str(args.get("language") or "python")
    result = row.get("result")
    code = result.get("exit_code") if isinstance(result, dict) else None
    stdout = (
        result.get("stdout") if isinstance(result, dict) else (result if isinstance(result, str) else None)
    )
    stderr = result.get("stderr") if isinstance(result, dict) else None
    elapsed = _checked(row.get("exec_time_s")) or _checked(row.get("elapsed_s")) or 0.0
    logged = _checked(row.get("ts"))
    end = anchor + int(logged * NS) if logged is not None else call_ts + int(elapsed * NS)
    start = max(call_ts, end - int(elapsed * NS))
    b.emit(
        ProcessExited(
            pid=0,
            argv=["python3" if language == "python" else "bash", "<script>"],
            start_ns=start,
            end_ns=max(end, start),
            exit_code=None if code is None else int(code),
            tracer="import",
            stdout=b.blob(stdout.encode(), "text/plain") if isinstance(stdout, str) and stdout else None,
            stderr=b.blob(stderr.encode(), "text/plain") if isinstance(stderr, str) and stderr else None,
        ),
        max(end, start),
    )
