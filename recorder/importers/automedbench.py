"""AutoMedBench run folders (the five branches' own layouts, told apart by ``detect``) as AMB runs.

Each API call the source counted becomes a ``model_call.completed`` paired in order with the
conversation's assistant messages (bodies rebuilt, marked synthetic), with its tool calls, results
and code executions; the output files a sealed submission; the source's own scores a note, never a
score of ours; everything the source did not keep a limitation note. docs/interop.md has the
layouts, the mapping and the limitations.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from calendar import timegm
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from recorder.importers.automedbench_calls import (
    NS,
    CallEmitter,
    Row,
    check_process_numbers,
    messages_without_conversation,
    read_calls,
    records,
    turn_of,
)
from recorder.importers.common import (
    DEFAULT_CAPS,
    ORIGIN_SCORES,
    ImportCaps,
    Rejected,
    RunBuilder,
    TaskResolver,
    as_dict,
    convert,
    read_bytes,
    read_json,
    read_jsonl,
    read_text,
    walk_files,
)
from recorder.importers.values import datetime_ns, seconds, shown
from schemas.blob import digest
from schemas.events import FileWritten, RunFinished, RunStarted, SealedFile, SubmissionSealed
from schemas.ostext import os_text
from schemas.untrusted_json import loads_untrusted

OUTPUT_CUT = {"seg": (3000, 2000), "det2d": (3000, 2000), "enhancement": (3000, 2000), "vqa": (6000, 4000)}
"""Characters of stdout and stderr each branch's executor keeps (the last ones); report keeps all."""

SUBMISSION_DIRS = ("agents_outputs", "agent_outputs", "plan")
SUBMISSION_FILES = ("agents_decision.csv",)

TASK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")

BriefFor = Callable[[str, str], str | None]
"""The brief the project would give (task, tier), used when the source kept no system prompt."""

T = TypeVar("T")


class _Said(msgspec.Struct):
    """What a JSON file of the folder says about the run; each names some of it, and ``parse``
    takes a thing from the first file that names it."""

    task: str | None = None
    tier: str | None = None
    agent: str | None = None
    model: str | None = None


class _Conversation(_Said):  # process/conversation.json (or a bare list of its messages)
    system_prompt: str | None = None
    fail_fast_reason: Any = None
    messages: list[Any] = []


class _Header(_Said):
    date: str | None = None  # YYYY-MM-DD HH:MM, the run's start to the minute


class _Runtime(msgspec.Struct):
    wall_time_s: Any = None


class _Report(_Said):  # detail_report.json (its scores are read apart, as the source's own)
    header: _Header | None = None
    runtime: _Runtime | None = None


class _AgentSummary(_Said):  # process/agent_summary.json (enhancement)
    aborted: Any = None
    elapsed_s: Any = None


class _VqaReport(msgspec.Struct):  # report.json (vqa)
    task: str | None = None
    model_name: str | None = None


class _RunSummary(msgspec.Struct):  # outputs/run_summary.json (vqa)
    started_at: str | None = None


def _doc(root: Path, path: Path, limits: ImportCaps, into: type[T]) -> T:
    """A JSON file of the folder as its Struct; an absent one reads as the Struct's defaults."""
    return convert(read_json(root, path, limits), into, shown(path)) if path.is_file() else into()


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


def _anchor(tag: str, date: str | None, started: str | None, where: str) -> tuple[int, bool]:
    """(Unix ns of the run's start, exact?) from the best absolute clock the folder has: the run
    summary's ``started_at`` (``where`` names it; refused when no run can start then), the run
    tag, the report's date."""
    if started is not None:
        try:
            dt = datetime.fromisoformat(started.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return datetime_ns(dt.replace(microsecond=0), f"{where}: started_at"), True
    parts = None
    if full := re.search(r"(\d{4})(\d{2})(\d{2})[_T](\d{2})(\d{2})(\d{2})", tag):  # YYYYMMDD_HHMMSS
        parts = [int(x) for x in full.groups()]
    elif short := re.search(r"^(\d{2})(\d{2})(\d{2})-[0-9a-f]{6}$", tag):  # YYMMDD-hex
        parts = [2000 + int(short[1]), int(short[2]), int(short[3]), 0, 0, 0]
    if parts is not None:
        with contextlib.suppress(ValueError, OverflowError):
            return timegm((*parts, 0, 0, 0)) * NS, False
    if m := re.match(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2})", date or ""):
        y, mo, d, h, mi = (int(x) for x in m.groups())
        return timegm((y, mo, d, h, mi, 0, 0, 0, 0)) * NS, False
    return 0, False


def _system_prompt(root: Path, f: Folder, conv: _Conversation, limits: ImportCaps) -> str | None:
    if conv.system_prompt is not None:
        return conv.system_prompt
    for candidate in (
        f.p("system_prompt.md"),
        root / "process" / "system_prompt.md",
        f.workspace / "tier_prompt.txt",
        root / "outputs" / "tier_prompt.txt",
    ):
        if candidate.is_file():
            return read_text(root, candidate, limits)
    return None


def run_id_for(branch: str, tag: str, f: Folder) -> str:
    """``amb-`` + 16 hex of sha256(branch, run tag, digest of the conversation or else the trace)."""
    h = hashlib.sha256(f"{branch}\0{tag}\0".encode())
    for name in ("conversation.json", "trace.jsonl", "tool_calls.jsonl", "tool_log.jsonl"):
        p = f.p(name)
        if p.is_file():
            with open(p, "rb") as fh:
                h.update(name.encode() + b"\0" + hashlib.file_digest(fh, "sha256").digest())
            break
    return "amb-" + h.hexdigest()[:16]


def _pick(*values: str | None) -> str | None:
    """The first value a file gave (an empty text gives none)."""
    return next((v for v in values if v), None)


class _Folder:
    """What ``parse`` reads of a run folder before a byte of the run is built: its JSON files as
    Structs, the tool log and the trace (records of varying fields), the API calls, the messages."""

    def __init__(self, root: Path, branch: str, limits: ImportCaps):
        self.root, self.branch, self.f = root, branch, Folder(root)
        f, self.tag = self.f, root.name
        conv_path = f.p("conversation.json")
        raw = read_json(root, conv_path, limits) if conv_path.is_file() else None
        if raw is not None and not isinstance(raw, list | dict):
            raise Rejected(f"{shown(conv_path)}: neither a message list nor an object")
        self.conversation_missing = raw is None
        self.conv = convert(
            raw if isinstance(raw, dict) else {"messages": raw or []}, _Conversation, shown(conv_path)
        )
        self.report = _doc(root, root / "detail_report.json", limits, _Report)
        self.header = self.report.header or _Header()
        self.vqa_report = _doc(root, root / "report.json", limits, _VqaReport)
        self.summary_path = root / "outputs" / "run_summary.json"
        self.summary = _doc(root, self.summary_path, limits, _RunSummary)
        self.agent_summary = _doc(root, f.p("agent_summary.json"), limits, _AgentSummary)
        tool_log = f.p("tool_log.jsonl" if branch == "enhancement" else "tool_calls.jsonl")
        tool_records = records(root, tool_log, limits) if tool_log.is_file() else []
        for where, row in tool_records:
            turn_of(row, where)  # a turn that is no whole number refuses the input
            check_process_numbers(row, where)
        self.tool_rows = [row for _, row in tool_records]
        self.trace = read_jsonl(root, f.p("trace.jsonl"), limits) if f.p("trace.jsonl").is_file() else []
        self.calls = read_calls(branch, root, f.process, limits)
        self.messages = self._messages()

    def _messages(self) -> list[Row]:
        messages = [m for m in self.conv.messages if isinstance(m, dict)]
        if self.conversation_missing:
            if not self.calls:
                raise Rejected(
                    f"{shown(self.root)}: neither a conversation nor any API call record to import"
                )
            messages = [{"role": "user", "content": ""}] + messages_without_conversation(
                self.calls, self.tool_rows
            )
        # The system message is never in the saved list (it is prepended at call time).
        return [m for m in messages if m.get("role") != "system"]

    def source_task(self) -> str | None:
        """The task as the source names it (checked to be a task id)."""
        c, s, r, h = self.conv, self.agent_summary, self.report, self.header
        parent = self.root.parent.name
        by_path = parent if self.branch != "enhancement" else None
        task = _pick(c.task, s.task, r.task, self.vqa_report.task, h.task, by_path)
        if (
            task
            and self.branch in ("seg", "det2d")
            and not task.endswith("-task")
            and parent.endswith("-task")
        ):
            # The seg runner writes the organ ("kidney") as the task; its run path names the task.
            _task_id(task, self.root)
            task = parent
        return _task_id(task, self.root) if task else None


def _task_id(name: str, root: Path) -> str:
    if not TASK_RE.match(name):
        raise Rejected(f"{shown(root)}: task name {name[:80]!r} is not a task id")
    return name


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
    d = _Folder(root, branch, limits)
    b = RunBuilder(run_id_for(branch, d.tag, d.f), origin=shown(root))
    c, s, h = d.conv, d.agent_summary, d.header
    source_task = d.source_task()
    task = resolve_task(source_task) if source_task else None
    tier = _pick(c.tier, s.tier, d.report.tier, h.tier)
    model = _pick(c.model, s.model, d.vqa_report.model_name, h.model)
    anchor, exact = _anchor(d.tag, h.date, d.summary.started_at, shown(d.summary_path))
    system = _system_prompt(root, d.f, c, limits)
    system_origin = "original"
    if system is None:
        rebuilt = brief_for(task, tier) if task and tier else None
        system, system_origin = (rebuilt, "reconstructed") if rebuilt else (None, "missing")
    labels = {
        "origin": "automedbench",
        "branch": branch,
        "run_tag": d.tag,
        "source_task": source_task or "",
        "time_base": "exact" if exact else "approx",
        "system_prompt": system_origin,
    }
    started = RunStarted(
        task=task,
        tier=tier,
        agent=_pick(c.agent, s.agent, d.report.agent, h.agent),
        model=model,
        command=[],
        backend="import",
        workspace=os_text(d.f.workspace.relative_to(root).as_posix()),
        labels=labels,
        tool_versions={"amb": amb_version} if amb_version else {},
    )
    b.emit(started, anchor)
    _limitations(b, d, exact, system_origin)
    CallEmitter(b, branch, d.messages, system, model, anchor).emit_all(d.calls, d.tool_rows)
    _emit_trace_notes(b, d.trace)
    reports = [root / "detail_report.json", root / "report.json", root / "detail_report_new-rubrics.json"]
    _emit_origin_scores(b, root, limits, reports)
    _emit_submission(b, root, d.f, branch, limits)
    _emit_finish(b, d, anchor)
    b.note_clamps()
    return b


def _limitations(b: RunBuilder, d: _Folder, exact: bool, system_origin: str) -> None:
    """What the source did not keep, each as a note."""
    if d.branch == "enhancement" and d.calls:
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
    if d.branch in OUTPUT_CUT:
        out_cap, err_cap = OUTPUT_CUT[d.branch]
        b.limitation(
            "cut_tool_output",
            f"the source harness kept only the last {out_cap} characters of stdout and {err_cap} of "
            "stderr of every code execution; the full output is lost",
            stdout_chars=out_cap,
            stderr_chars=err_cap,
        )
    if d.conversation_missing:
        b.limitation(
            "missing_conversation",
            "process/conversation.json was never written (the run ended early); the model calls "
            "are rebuilt from trace.jsonl and the tool log: assistant text is the 300-character "
            "preview and reasoning is lost",
        )


def _emit_trace_notes(b: RunBuilder, trace: list[dict[str, Any]]) -> None:
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


def _emit_finish(b: RunBuilder, d: _Folder, anchor: int) -> None:
    run_end: Row = next((r for r in reversed(d.trace) if r.get("type") == "run_end"), {})
    runtime = d.report.runtime or _Runtime()
    wall = (
        seconds(run_end.get("wall_time_s"), f"{shown(d.f.p('trace.jsonl'))}: run_end: wall_time_s")
        or seconds(d.agent_summary.elapsed_s, f"{shown(d.f.p('agent_summary.json'))}: elapsed_s")
        or seconds(runtime.wall_time_s, f"{shown(d.root / 'detail_report.json')}: runtime.wall_time_s")
        or (b.last_ts - anchor) / NS
    )
    if any(r.get("type") == "isolation_breach" for r in d.trace):
        status, reason = "failed", "isolation breach (second sandbox violation)"
    elif d.conv.fail_fast_reason:
        status, reason = "failed", f"fail-fast: {d.conv.fail_fast_reason}"
    elif d.agent_summary.aborted:
        status, reason = "failed", f"aborted: {d.agent_summary.aborted}"
    else:
        status, reason = "completed", None
    finished = RunFinished(
        status=status,
        exit_code=None,
        duration_s=float(wall),
        reason=reason,
        counts={"import": len(b.events) + 1},
    )
    b.emit(finished, max(b.last_ts, anchor + int(wall * NS)))
