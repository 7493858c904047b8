"""AutoMedBench run folders (the five branches' own layouts) as AMB runs.

Layouts, told apart by their files (the writers are ``benchmark_runner.py`` of ``eval_seg``,
``eval_det2d``, ``eval_vqa`` and ``eval_report_gen``, and ``docker/agent/agent_loop.py`` of
``eval_seg``/``eval_det2d`` and ``eval_image_enhancement``):

==============  ==========================================================================
branch          recognised by
==============  ==========================================================================
report          ``process/api_responses.jsonl``
enhancement     ``workspace/process/`` or ``process/tool_log.jsonl``
vqa             ``outputs/run_summary.json`` or ``report.json``
det2d           ``process/trace.jsonl`` / ``conversation.json`` whose submit check or report
                names predictions (``missing_predictions``, ``predictions_valid``)
seg             ``process/trace.jsonl`` or ``process/conversation.json`` otherwise
==============  ==========================================================================

What comes out: ``run.started`` (backend ``import``), one ``model_call.completed`` per API call the
source counted (its ``api_call`` trace records; ``api_responses.jsonl`` lines in report; trace
lines in enhancement), each with a request and a response body rebuilt from the conversation
(media type ``application/vnd.amb.synthetic+json``); ``tool_call.requested`` / ``tool_call.result``
per tool call; ``process.exited`` per logged code execution; ``note``s for violations, the submit
check, harness messages and every limitation of the source (data kind ``import.limitation``); the
source's own scores as a blob behind a ``note`` of kind ``origin_scores`` (never a score of ours);
the output files as ``file.written`` and ``submission.sealed``; ``run.finished``.
"""

from __future__ import annotations

import hashlib
import json
import re
from calendar import timegm
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recorder.importers.common import (
    DEFAULT_CAPS,
    ORIGIN_SCORES,
    ImportCaps,
    Rejected,
    RunBuilder,
    TaskResolver,
    as_dict,
    read_bytes,
    read_json,
    read_jsonl,
    read_text,
    walk_files,
)
from recorder.importers.values import COUNT_MAX, count, datetime_ns, seconds, shown, whole
from schemas.blob import digest
from schemas.events import (
    AssistantMessage,
    FileWritten,
    ModelCallCompleted,
    ProcessExited,
    RunFinished,
    RunStarted,
    SealedFile,
    SubmissionSealed,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from schemas.ostext import os_text
from schemas.providers import openai_chat
from schemas.providers.conversation import Conversation, Message, Part, Reply, Tool
from schemas.untrusted_json import loads_untrusted

BRANCHES = ("seg", "det2d", "vqa", "report", "enhancement")

OUTPUT_CUT = {"seg": (3000, 2000), "det2d": (3000, 2000), "enhancement": (3000, 2000), "vqa": (6000, 4000)}
"""Characters of stdout and stderr each branch's executor keeps (the last ones); report keeps all."""

SUBMISSION_DIRS = ("agents_outputs", "agent_outputs", "plan")
SUBMISSION_FILES = ("agents_decision.csv",)

TASK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

NS = 1_000_000_000

BriefFor = Callable[[str, str], str | None]
"""The brief the project would give (task, tier), used when the source kept no system prompt."""


class Folder:
    """The files of one run folder, by role (None where the layout has no such file)."""

    def __init__(self, root: Path):
        self.root = root
        enh = root / "workspace" / "process"
        self.process = enh if enh.is_dir() else root / "process"
        self.workspace = root / "workspace" if enh.is_dir() else root / "outputs"

    def p(self, name: str) -> Path:
        return self.process / name


def detect(root: Path, limits: ImportCaps) -> str:
    """The branch that wrote ``root``; ``Rejected`` (unknown layout) if none did."""
    f = Folder(root)
    if f.p("api_responses.jsonl").is_file():
        return "report"
    if (root / "workspace" / "process").is_dir() or f.p("tool_log.jsonl").is_file():
        return "enhancement"
    if (root / "outputs" / "run_summary.json").is_file() or (root / "report.json").is_file():
        return "vqa"
    if f.p("trace.jsonl").is_file() or f.p("conversation.json").is_file():
        for rec in read_jsonl(root, f.p("trace.jsonl"), limits) if f.p("trace.jsonl").is_file() else []:
            if rec.get("type") == "submit" and "missing_predictions" in rec:
                return "det2d"
        report = root / "detail_report.json"
        if report.is_file():
            data = read_json(root, report, limits)
            fmt = data.get("format") if isinstance(data, dict) else None
            if isinstance(fmt, dict) and "predictions_valid" in fmt:
                return "det2d"
        return "seg"
    raise Rejected(
        f"{root}: unknown layout (no process/trace.jsonl, process/conversation.json, "
        "process/api_responses.jsonl or workspace/process/ of an AutoMedBench run)"
    )


def _anchor(tag: str, report: dict[str, Any], summary: dict[str, Any], where: str) -> tuple[int, bool]:
    """(Unix ns of the run's start, exact?) from the best absolute clock the folder has (``where``
    names run_summary.json, whose ``started_at`` is refused when no run can start then)."""
    started = summary.get("started_at")
    if isinstance(started, str):
        try:
            from datetime import datetime

            dt = datetime.fromisoformat(started.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return datetime_ns(dt.replace(microsecond=0), f"{where}: started_at"), True
    for pattern, fmt_len in ((r"(\d{8})[_T](\d{6})", 2), (r"^(\d{6})-[0-9a-f]{6}$", 1)):
        m = re.search(pattern, tag)
        if m:
            if fmt_len == 2:
                d, t = m.group(1), m.group(2)
                parts = (int(d[:4]), int(d[4:6]), int(d[6:]), int(t[:2]), int(t[2:4]), int(t[4:]))
            else:
                d = m.group(1)
                parts = (2000 + int(d[:2]), int(d[2:4]), int(d[4:]), 0, 0, 0)
            try:
                return timegm((*parts, 0, 0, 0)) * NS, False
            except (ValueError, OverflowError):
                break
    header = as_dict(report.get("header"))
    date = header.get("date") if header else None
    if isinstance(date, str):
        m = re.match(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2})", date)
        if m:
            y, mo, d, h, mi = (int(x) for x in m.groups())
            return timegm((y, mo, d, h, mi, 0, 0, 0, 0)) * NS, False
    return 0, False


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return ""


def _reasoning(msg: dict[str, Any]) -> str:
    details = msg.get("reasoning_details")
    if isinstance(details, str):
        return details
    if isinstance(details, list):
        out = []
        for d in details:
            if isinstance(d, dict):
                out.append(str(d.get("text") or d.get("summary") or ""))
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


class _Call:
    """One API call as the source counted it: tokens, finish reason, relative time."""

    def __init__(self, rec: dict[str, Any], ts: float | None, tin: int | None, tout: int | None, where: str):
        self.rec = rec
        self.ts = ts
        self.input = tin
        self.output = tout
        self.finish = rec.get("finish_reason")
        self.preview = str(rec.get("content") or rec.get("content_preview") or "")
        self.names = [str(n) for n in rec.get("tool_calls") or [] if isinstance(n, str)]
        self.api_s = seconds(rec.get("api_s"), f"{where}: api_s")
        self.turn = _turn(rec, where)


def _tokens(rec: dict[str, Any], key: str, where: str) -> int | None:
    """A token count of a record (None when it has none); a value that is no count refuses the input."""
    return None if rec.get(key) is None else count(rec.get(key), f"{where}: {key}")


def _turn(rec: dict[str, Any], where: str) -> int | None:
    return whole(rec.get("turn"), f"{where}: turn", 0, COUNT_MAX)


def _records(root: Path, path: Path, limits: ImportCaps) -> list[tuple[str, dict[str, Any]]]:
    """The records of a JSON-lines file, each with where it is (``FILE: record N``) for messages."""
    where = shown(path)
    return [(f"{where}: record {i}", rec) for i, rec in enumerate(read_jsonl(root, path, limits), 1)]


def _calls(branch: str, root: Path, f: Folder, limits: ImportCaps) -> list[_Call]:
    trace = _records(root, f.p("trace.jsonl"), limits) if f.p("trace.jsonl").is_file() else []
    if branch == "report":
        out = []
        for where, line in _records(root, f.p("api_responses.jsonl"), limits):
            resp = as_dict(line.get("response"))
            rec = {
                "finish_reason": resp.get("finish_reason"),
                "content": resp.get("content"),
                "tool_calls": [t.get("name") for t in resp.get("tool_calls") or [] if isinstance(t, dict)],
            }
            where = f"{where}: response"
            tin, tout = _tokens(resp, "input_tokens", where), _tokens(resp, "output_tokens", where)
            out.append(_Call(rec, None, tin, tout, where))
        return out
    if branch == "enhancement":
        out, prev_in, prev_out = [], 0, 0
        for where, rec in trace:
            tin, tout = _tokens(rec, "prompt_tokens", where), _tokens(rec, "completion_tokens", where)
            din = None if tin is None else tin - prev_in
            dout = None if tout is None else tout - prev_out
            prev_in, prev_out = tin or prev_in, tout or prev_out
            names = [(t.get("name") if isinstance(t, dict) else t) for t in rec.get("tool_calls") or []]
            ts = seconds(rec.get("ts"), f"{where}: ts")
            out.append(_Call({**rec, "tool_calls": names}, ts, din, dout, where))
        return out
    return [
        _Call(
            rec,
            seconds(rec.get("ts"), f"{where}: ts"),
            _tokens(rec, "input_tokens", where),
            _tokens(rec, "output_tokens", where),
            where,
        )
        for where, rec in trace
        if rec.get("type") == "api_call"
    ]


def _messages_without_conversation(
    calls: list[_Call], tool_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A conversation rebuilt from the trace and the tool log (the conversation file was never written)."""
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for row in tool_rows:
        turn = row.get("turn")  # a whole number or None: checked when read (parse)
        if turn is not None:
            by_turn.setdefault(int(turn), []).append(row)
    messages: list[dict[str, Any]] = []
    for k, call in enumerate(calls):
        turn = call.turn or k + 1
        rows = by_turn.get(turn, [])
        tcs, results = [], []
        for i, row in enumerate(rows):
            tc_id = f"import_{turn}_{i}"
            name = str(row.get("tool") or row.get("name") or "unknown")
            args = as_dict(row.get("arguments"))
            if not args and ("code" in row or "language" in row):
                args = {"language": row.get("language"), "code": row.get("code")}
            tcs.append(
                {"id": tc_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            )
            result = row.get("result")
            results.append({"role": "tool", "tool_call_id": tc_id, "content": json.dumps(result)})
        msg: dict[str, Any] = {"role": "assistant", "content": call.preview or None}
        if tcs:
            msg["tool_calls"] = tcs
        messages.append(msg)
        messages.extend(results)
    return messages


def _system_prompt(
    branch: str, root: Path, f: Folder, conv: dict[str, Any], limits: ImportCaps
) -> str | None:
    if isinstance(conv.get("system_prompt"), str):
        return conv["system_prompt"]
    for candidate in (f.p("system_prompt.md"), root / "process" / "system_prompt.md"):
        if candidate.is_file():
            return read_text(root, candidate, limits)
    for candidate in (f.workspace / "tier_prompt.txt", root / "outputs" / "tier_prompt.txt"):
        if candidate.is_file():
            return read_text(root, candidate, limits)
    return None


def run_id_for(branch: str, tag: str, root: Path, f: Folder) -> str:
    """``amb-`` + 16 hex of sha256(branch, run tag, digest of the conversation or else the trace)."""
    h = hashlib.sha256(f"{branch}\0{tag}\0".encode())
    for name in ("conversation.json", "trace.jsonl", "tool_calls.jsonl", "tool_log.jsonl"):
        p = f.p(name)
        if p.is_file():
            with open(p, "rb") as fh:
                h.update(name.encode() + b"\0" + hashlib.file_digest(fh, "sha256").digest())
            break
    return "amb-" + h.hexdigest()[:16]


def parse(
    root: Path,
    *,
    resolve_task: TaskResolver = lambda t: t,
    brief_for: BriefFor = lambda task, tier: None,
    limits: ImportCaps = DEFAULT_CAPS,
    amb_version: str = "",
) -> RunBuilder:
    """Read one run folder into an in-memory run (nothing is written)."""
    root = root.resolve()
    if not root.is_dir():
        raise Rejected(f"{shown(root)}: not a folder")
    branch = detect(root, limits)
    f = Folder(root)
    tag = root.name
    b = RunBuilder(run_id_for(branch, tag, root, f), origin=shown(root))

    conv_path = f.p("conversation.json")
    raw_conv = read_json(root, conv_path, limits) if conv_path.is_file() else None
    if raw_conv is not None and not isinstance(raw_conv, list | dict):
        raise Rejected(f"{shown(conv_path)}: neither a message list nor an object")
    conv: dict[str, Any] = raw_conv if isinstance(raw_conv, dict) else {}
    report_path = root / "detail_report.json"
    report = read_json(root, report_path, limits) if report_path.is_file() else {}
    report = report if isinstance(report, dict) else {}
    vqa_report_path = root / "report.json"
    vqa_report = read_json(root, vqa_report_path, limits) if vqa_report_path.is_file() else {}
    vqa_report = vqa_report if isinstance(vqa_report, dict) else {}
    summary_path = root / "outputs" / "run_summary.json"
    summary = read_json(root, summary_path, limits) if summary_path.is_file() else {}
    summary = summary if isinstance(summary, dict) else {}
    agent_summary_path = f.p("agent_summary.json")
    agent_summary = read_json(root, agent_summary_path, limits) if agent_summary_path.is_file() else {}
    agent_summary = agent_summary if isinstance(agent_summary, dict) else {}
    header = as_dict(report.get("header"))
    tool_log_name = "tool_log.jsonl" if branch == "enhancement" else "tool_calls.jsonl"
    tool_records = _records(root, f.p(tool_log_name), limits) if f.p(tool_log_name).is_file() else []
    for where, row in tool_records:
        _turn(row, where)  # a turn that is no whole number refuses the input
        _process_numbers(row, where)
    tool_rows = [row for _, row in tool_records]
    trace = read_jsonl(root, f.p("trace.jsonl"), limits) if f.p("trace.jsonl").is_file() else []

    calls = _calls(branch, root, f, limits)

    if isinstance(raw_conv, list):
        messages = [m for m in raw_conv if isinstance(m, dict)]
    elif isinstance(conv.get("messages"), list):
        messages = [m for m in conv["messages"] if isinstance(m, dict)]
    else:
        messages = []
    conversation_missing = raw_conv is None
    if conversation_missing:
        if not calls:
            raise Rejected(f"{shown(root)}: neither a conversation nor any API call record to import")
        messages = [{"role": "user", "content": ""}] + _messages_without_conversation(calls, tool_rows)
    # The system message is never in the saved list (it is prepended at call time).
    messages = [m for m in messages if m.get("role") != "system"]

    def pick(*values: Any) -> str | None:
        for v in values:
            if isinstance(v, str) and v:
                return v
        return None

    source_task = pick(
        conv.get("task"),
        agent_summary.get("task"),
        report.get("task"),
        vqa_report.get("task"),
        header.get("task"),
        root.parent.name if branch != "enhancement" else None,
    )
    if source_task and not TASK_RE.match(source_task):
        raise Rejected(f"{shown(root)}: task name {source_task[:80]!r} is not a task id")
    if branch in ("seg", "det2d") and source_task and not source_task.endswith("-task"):
        # The seg runner writes the organ ("kidney") as the task; its run path names the task.
        path_task = root.parent.name
        if path_task.endswith("-task"):
            source_task = path_task
    if source_task and not TASK_RE.match(source_task):
        raise Rejected(f"{shown(root)}: task name {source_task[:80]!r} is not a task id")
    task = resolve_task(source_task) if source_task else None
    tier = pick(conv.get("tier"), agent_summary.get("tier"), report.get("tier"), header.get("tier"))
    agent = pick(conv.get("agent"), agent_summary.get("agent"), report.get("agent"), header.get("agent"))
    model = pick(
        conv.get("model"), agent_summary.get("model"), vqa_report.get("model_name"), header.get("model")
    )
    anchor, exact = _anchor(tag, report, summary, shown(summary_path))
    system = _system_prompt(branch, root, f, conv, limits)
    system_origin = "original"
    if system is None:
        rebuilt = brief_for(task, tier) if task and tier else None
        system, system_origin = (rebuilt, "reconstructed") if rebuilt else (None, "missing")

    b.emit(
        RunStarted(
            task=task,
            tier=tier,
            agent=agent,
            model=model,
            command=[],
            backend="import",
            workspace=os_text(f.workspace.relative_to(root).as_posix()),
            labels={
                "origin": "automedbench",
                "branch": branch,
                "run_tag": tag,
                "source_task": source_task or "",
                "time_base": "exact" if exact else "approx",
                "system_prompt": system_origin,
            },
            tool_versions={"amb": amb_version} if amb_version else {},
        ),
        anchor,
    )
    if branch == "enhancement" and calls:
        b.limitation(
            "running_total_tokens",
            "token counts in trace.jsonl are running totals; per-call counts are their differences",
        )
    b.limitation(
        "approximate_clock",
        "the source logs relative seconds (or none); absolute times are the run's start as the folder "
        + ("gives it (run_summary.json, to the second)" if exact else "names it (run tag or report date)")
        + " plus those offsets",
        anchor_exact=exact,
    )
    if system_origin != "original":
        b.limitation(
            "missing_system_prompt",
            "the source kept no system prompt; "
            + (
                "the request bodies carry the project's brief for this task and tier instead"
                if system_origin == "reconstructed"
                else "the request bodies carry none"
            ),
        )
    if branch in OUTPUT_CUT:
        out_cap, err_cap = OUTPUT_CUT[branch]
        b.limitation(
            "cut_tool_output",
            f"the source harness kept only the last {out_cap} characters of stdout and {err_cap} of "
            "stderr of every code execution; the full output is lost",
            stdout_chars=out_cap,
            stderr_chars=err_cap,
        )
    if conversation_missing:
        b.limitation(
            "missing_conversation",
            "process/conversation.json was never written (the run ended early); the model calls "
            "are rebuilt from trace.jsonl and the tool log: assistant text is the 300-character "
            "preview and reasoning is lost",
        )

    _emit_calls(b, branch, calls, messages, system, model, anchor, tool_rows, trace)
    _emit_trace_notes(b, trace, anchor)
    _emit_origin_scores(
        b, root, limits, [report_path, vqa_report_path, root / "detail_report_new-rubrics.json"]
    )
    _emit_submission(b, root, f, branch, limits)
    _emit_finish(b, f, trace, conv, report, agent_summary, anchor)
    b.note_clamps()
    return b


def _emit_calls(
    b: RunBuilder,
    branch: str,
    calls: list[_Call],
    messages: list[dict[str, Any]],
    system: str | None,
    model: str | None,
    anchor: int,
    tool_rows: list[dict[str, Any]],
    trace: list[dict[str, Any]],
) -> None:
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    n = max(len(calls), len(assistant_at))
    if len(calls) > len(assistant_at):
        b.limitation(
            "missing_last_assistant_turn",
            f"{len(calls) - len(assistant_at)} API call(s) have no assistant message in the conversation "
            "(the source stops before saving a final answer without tool calls); their text is the "
            f"{300 if branch != 'report' else 'full'}-character preview from trace.jsonl",
            calls=len(calls) - len(assistant_at),
        )
    if len(assistant_at) > len(calls):
        b.limitation(
            "missing_token_counts",
            f"{len(assistant_at) - len(calls)} assistant message(s) have no API call record; "
            "their token counts are unknown",
        )
    tool_names = sorted(
        {
            str(tc.get("function", {}).get("name"))
            for m in messages
            for tc in m.get("tool_calls") or []
            if isinstance(tc, dict) and isinstance(tc.get("function"), dict)
        }
    )
    tools = [Tool(name) for name in tool_names]
    head = [Message("system", Part.texts(system))] if system is not None else []
    rows_by_turn: dict[int, list[dict[str, Any]]] = {}
    for row in tool_rows:
        turn = row.get("turn")  # a whole number or None: checked when read (parse)
        if turn is not None:
            rows_by_turn.setdefault(int(turn), []).append(row)
    # Results not yet "sent": emitted just before the call whose request carries them.
    pending: list[tuple[dict[str, Any], str]] = []
    call_of_tool: dict[str, str] = {}
    name_of_tool: dict[str, str] = {}
    last_ts = anchor
    for k in range(n):
        call = calls[k] if k < len(calls) else None
        at = assistant_at[k] if k < len(assistant_at) else None
        msg = messages[at] if at is not None else None
        history = messages[:at] if at is not None else messages
        call_id = f"c{k + 1:04d}"
        ts = anchor + int(call.ts * NS) if call is not None and call.ts is not None else last_ts + 1_000_000
        latency = call.api_s * 1000 if call is not None and call.api_s is not None else None
        started = ts - int(latency * 1e6) if latency is not None else ts
        # Results of earlier tool calls that this request carries.
        carried = {m.get("tool_call_id") for m in history if m.get("role") == "tool"}
        still = []
        for tmsg, req_call in pending:
            if tmsg.get("tool_call_id") in carried:
                _emit_result(b, tmsg, call_id, name_of_tool, started)
            else:
                still.append((tmsg, req_call))
        pending = still
        text = _text(msg.get("content")) if msg else (call.preview if call else "")
        reasoning = _reasoning(msg) if msg else ""
        tcs: list[ToolCallPart] = []
        for tc in (msg.get("tool_calls") or []) if msg else []:
            if not isinstance(tc, dict):
                continue
            fn = as_dict(tc.get("function"))
            raw = fn.get("arguments")
            args = raw if isinstance(raw, str) else json.dumps(raw if raw is not None else {})
            tcs.append(
                ToolCallPart(
                    id=str(tc.get("id") or f"{call_id}_{len(tcs)}"),
                    name=str(fn.get("name") or ""),
                    arguments=args,
                )
            )
        finish = call.finish if call is not None and isinstance(call.finish, str) else None
        said = openai_chat.conversation({"messages": history}).messages  # the source's are Chat's
        request = openai_chat.build_request(Conversation(head + said, tools, model))
        message = AssistantMessage(text=text, reasoning=reasoning, tool_calls=tcs)
        usage = Usage(
            input_total=(call.input or 0) if call else 0,
            output=(call.output or 0) if call else 0,
            reported=call is not None and call.input is not None,
        )
        reply = Reply(message, model, finish, usage if usage.reported else None, f"{b.run_id}-{call_id}")
        last_ts = b.emit(
            ModelCallCompleted(
                call_id=call_id,
                provider="openai",
                api="chat.completions",
                model=model,
                stream=False,
                url="",
                status=200,
                ok=True,
                request=b.json_blob(request),
                response=b.json_blob(openai_chat.build_response(reply)),
                message=message,
                stop_reason=finish,
                usage=usage,
                started_ns=started,
                latency_ms=latency,
                partial=msg is None,
            ),
            ts,
        )
        for t in tcs:
            b.emit(
                ToolCallRequested(
                    tool_call_id=t.id, name=t.name, arguments=t.arguments, model_call_id=call_id
                ),
                ts,
            )
            call_of_tool[t.id] = call_id
            name_of_tool[t.id] = t.name
        turn = call.turn if call is not None else None
        # VQA numbers tool rows by the next code run, not by the API call: they cannot be paired.
        if branch == "vqa" or turn is None:
            rows: list[dict[str, Any]] = []
        else:
            rows = rows_by_turn.get(turn, [])
        for row in rows:
            _emit_process(b, row, anchor, ts)
        if at is not None:
            j = at + 1
            while j < len(messages) and messages[j].get("role") == "tool":
                pending.append((messages[j], call_id))
                j += 1
    # Results no later request carried (the last submit, a cut-off run): still the harness's facts.
    for tmsg, req_call in pending:
        _emit_result(b, tmsg, req_call, name_of_tool, b.last_ts)


def _emit_result(
    b: RunBuilder, tmsg: dict[str, Any], carried_by: str, names: dict[str, str], ts: int
) -> None:
    tc_id = str(tmsg.get("tool_call_id") or "")
    content = _text(tmsg.get("content"))
    b.emit(
        ToolCallResult(
            tool_call_id=tc_id,
            model_call_id=carried_by,
            name=names.get(tc_id),
            output=content,
            is_error=_is_error(content),
        ),
        ts,
    )


def _process_numbers(row: dict[str, Any], where: str) -> None:
    """Refuse a tool-log row whose code execution's numbers are no facts (checked once, when read)."""
    result = row.get("result")
    if isinstance(result, dict):
        whole(result.get("exit_code"), f"{where}: result.exit_code", -(1 << 31), (1 << 31) - 1)
    for key in ("exec_time_s", "elapsed_s", "ts"):
        seconds(row.get(key), f"{where}: {key}")


def _checked(x: Any) -> float | None:
    """A number ``_process_numbers`` checked (None stays None)."""
    return None if x is None else float(x)


def _checked_int(x: Any) -> int | None:
    return None if x is None else int(x)


def _emit_process(b: RunBuilder, row: dict[str, Any], anchor: int, call_ts: int) -> None:
    name = row.get("tool") or row.get("name")
    if name not in ("execute_code", None) and "code" not in row:
        return
    args = as_dict(row.get("arguments")) or row
    language = str(args.get("language") or "python")
    result = row.get("result")
    exit_code = _checked_int(result.get("exit_code")) if isinstance(result, dict) else None
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
            exit_code=exit_code,
            tracer="import",
            stdout=b.blob(stdout.encode(), "text/plain") if isinstance(stdout, str) and stdout else None,
            stderr=b.blob(stderr.encode(), "text/plain") if isinstance(stderr, str) and stderr else None,
        ),
        max(end, start),
    )


def _emit_trace_notes(b: RunBuilder, trace: list[dict[str, Any]], anchor: int) -> None:
    for rec in trace:
        kind = rec.get("type")
        if kind in ("violation_warning", "isolation_breach"):
            b.note(
                f"{kind.replace('_', ' ')} at turn {rec.get('turn')}: {str(rec.get('violation'))[:500]}",
                "amb.import.violation",
                violation=kind,
                record=rec,
            )
        elif kind == "submit":
            b.note("submit check by the source harness", "submit_check", check=rec)


def _emit_origin_scores(b: RunBuilder, root: Path, limits: ImportCaps, paths: list[Path]) -> None:
    for path in paths:
        if not path.is_file():
            continue
        data = read_bytes(root, path, limits)
        ref = b.blob(data, "application/json")
        facts: dict[str, Any] = {
            "path": path.relative_to(root).as_posix(),
            "blob": ref.blob,
            "size": ref.size,
        }
        try:
            doc = loads_untrusted(data)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            inner = as_dict(doc.get("detail_report")) or doc
            for key in ("clinical_score", "task_score", "agentic_score"):
                v = inner.get(key)
                if isinstance(v, dict) and isinstance(v.get("score"), int | float):
                    facts[key] = v["score"]
            scores = inner.get("scores")
            if isinstance(scores, dict):
                facts["scores"] = {k: v for k, v in scores.items() if isinstance(v, int | float)}
        b.note(
            f"the source harness's own scores ({facts['path']}): kept for comparison, never scored",
            ORIGIN_SCORES,
            **facts,
        )


def _emit_submission(b: RunBuilder, root: Path, f: Folder, branch: str, limits: ImportCaps) -> None:
    ws = f.workspace
    files: list[tuple[str, Path]] = []
    for sub in SUBMISSION_DIRS:
        files += [(f"{sub}/{rel}", p) for rel, p in walk_files(root, ws / sub, limits)]
    for name in SUBMISSION_FILES:
        if (ws / name).is_file() or (ws / name).is_symlink():
            files.append((name, ws / name))
    if branch == "vqa" and ws.is_dir():
        # The submit_answer helper writes <workspace>/<question id>/answer.json.
        for qdir in sorted(p for p in ws.iterdir() if p.is_dir() and not p.is_symlink()):
            if (qdir / "answer.json").exists() and qdir.name not in SUBMISSION_DIRS:
                files.append((f"{qdir.name}/answer.json", qdir / "answer.json"))
    sealed = []
    ts = b.last_ts
    for name, p in files:
        rel = os_text(name)  # a name from the folder: any bytes
        data = read_bytes(root, p, limits)
        ref = b.blob(data, "application/octet-stream")
        sha = digest(data)
        b.emit(FileWritten(path=rel, op="created", size=len(data), sha256=sha, content=ref), ts)
        sealed.append(SealedFile(path=rel, size=len(data), sha256=sha, content=ref))
    if files:
        b.emit(SubmissionSealed(root="", files=sealed), ts)
    else:
        b.limitation("no_outputs", "the folder holds no output files: TASK scores as every case missing")


def _emit_finish(
    b: RunBuilder,
    f: Folder,
    trace: list[dict[str, Any]],
    conv: dict[str, Any],
    report: dict[str, Any],
    agent_summary: dict[str, Any],
    anchor: int,
) -> None:
    run_end: dict[str, Any] = next((r for r in reversed(trace) if r.get("type") == "run_end"), {})
    breach = any(r.get("type") == "isolation_breach" for r in trace)
    fail_fast = conv.get("fail_fast_reason")
    aborted = agent_summary.get("aborted")
    runtime = as_dict(report.get("runtime"))
    wall = (
        seconds(run_end.get("wall_time_s"), f"{shown(f.p('trace.jsonl'))}: run_end: wall_time_s")
        or seconds(agent_summary.get("elapsed_s"), f"{shown(f.p('agent_summary.json'))}: elapsed_s")
        or seconds(runtime.get("wall_time_s"), f"{shown(f.root / 'detail_report.json')}: runtime.wall_time_s")
        or (b.last_ts - anchor) / NS
    )
    if breach:
        status, reason = "failed", "isolation breach (second sandbox violation)"
    elif fail_fast:
        status, reason = "failed", f"fail-fast: {fail_fast}"
    elif aborted:
        status, reason = "failed", f"aborted: {aborted}"
    else:
        status, reason = "completed", None
    b.emit(
        RunFinished(
            status=status,
            exit_code=None,
            duration_s=float(wall),
            reason=reason,
            counts={"import": len(b.events) + 1},
        ),
        max(b.last_ts, anchor + int(wall * NS)),
    )
