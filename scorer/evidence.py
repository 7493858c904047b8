"""The evidence view: exactly what a judge sees of a run. A deterministic function of the events.

Built from the folded trajectory only (no clock, no environment, no dict-order dependence): its
sha256 is part of every judge call's cache key, so changing the evidence rules re-asks the judge and
nothing else does. The layout is AutoMedBench's ``llm_judge.py`` summariser with event ids added
(docs/scoring.md, Evidence view). Model-supplied text is defanged (``neutralise``) so a transcript
cannot fake a section header or a verdict in the judge's prompt.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from scorer.profile import EvidenceRules
from scorer.trajectory import BlobGetter, Exec, Trajectory, blob_or_empty

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLAN_IMAGE_MAX = 5 << 20
"""The largest plan.png read and shown to the judge: the providers' own limit for one image
(Anthropic's is 5 MB). A larger one is stated by its size, not read (an agent can write any size)."""
NAME_CHARS = 300
"""The most characters of a name the run recorded (a file's path, a tool's name) the view shows."""
MAX_FILES = 200
"""The most written files the view lists (the first in path order; the rest are counted)."""
_ID_RE = re.compile(r"^\[([A-Za-z0-9._-]+:\d+)\]")


class Image(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    event_id: str
    media_type: str
    data: bytes


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    sha256: str
    """``sha256:`` of ``text`` plus the digests of ``images``: the evidence's cache identity."""
    images: list[Image] = []
    cited_ids: list[str] = []
    """Every event id that appears in the view (a verdict may cite only these)."""


def neutralise(text: str) -> str:
    """Defang model text: no section headers, no fenced JSON, no fake verdict lines, no line that
    starts as an event's line does (``[proxy:12] ...``)."""
    return (
        text.replace("\r", "")
        .replace("```", "'''")
        .replace("\n#", "\n #")
        .replace("\n[", "\n [")
        .replace("<<<", "< < <")
        .replace(">>>", "> > >")
    )


def cut(text: str, limit: int) -> str:
    text = neutralise(text)
    if limit <= 0 or len(text) <= limit:
        return text
    return text[:limit] + f"…[+{len(text) - limit} chars]"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _name(text: str | None, limit: int = NAME_CHARS) -> str:
    """A name the run recorded (a file's path, a tool's name, a role) on one defanged line of at
    most ``limit`` characters (0: any): the agent chose it, so it may be of any length and hold a
    newline, a fence marker or a line that looks like an event's."""
    return cut(_flat(text or ""), limit) or "-"


def _message_lines(traj: Trajectory, r: EvidenceRules) -> list[str]:
    lines = []
    for m in traj.messages:
        limit = {"tool_call": r.arg_chars, "tool": r.tool_result_chars}.get(m.role, r.message_chars)
        text = cut(_flat(m.text), limit)
        line = f"[{m.id}] {_name(m.role)}: {text}"
        lines.append(cut(line, r.message_chars + 40) if r.message_chars else line)
    return lines


def _fitting(lines: Iterable[str], budget: int) -> list[str]:
    """The leading ``lines`` whose text (one newline each) fits in ``budget`` characters."""
    out: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > budget:
            break
        out.append(line)
        used += len(line) + 1
    return out


def budget_lines(lines: list[str], r: EvidenceRules) -> list[str]:
    """AutoMedBench's HEAD / MIDDLE / TAIL cut of the conversation to ``budget_chars``."""
    total = sum(len(line) + 1 for line in lines)
    if r.budget_chars <= 0 or total <= r.budget_chars:
        return lines
    head = _fitting(lines, int(r.budget_chars * r.head))
    tail = _fitting(reversed(lines[len(head) :]), int(r.budget_chars * r.tail))[::-1]
    rest = lines[len(head) : len(lines) - len(tail)]
    step = max(1, math.ceil(len(rest) / 20))
    middle = _fitting(rest[::step], int(r.budget_chars * r.middle))
    omitted = len(rest) - len(middle)
    marker = f"... [{omitted} of {len(lines)} messages omitted; middle sampled every {step}th] ..."
    return head + [marker] + middle + ["... [end of middle sample] ..."] + tail


def select_execs(execs: list[Exec], r: EvidenceRules) -> list[Exec]:
    """First ``exec_head``, up to ``exec_middle_failed`` failures from the middle, last ``exec_tail``."""
    n = len(execs)
    if n <= r.exec_head + r.exec_tail:
        return list(execs)
    head = execs[: r.exec_head]
    tail = execs[n - r.exec_tail :]
    middle = [e for e in execs[r.exec_head : n - r.exec_tail] if e.ok is False][: r.exec_middle_failed]
    return head + middle + tail


def _exec_line(ex: Exec, r: EvidenceRules) -> str:
    fail = f"FAIL({ex.exit_code if ex.exit_code is not None else 'error'})"
    status = "NO RESULT" if ex.ok is None else "OK" if ex.ok else fail
    out = ex.stdout if ex.exit_code is not None else ex.output
    if ex.ok is False and ex.stderr:
        out = ex.stderr
    return (
        f"[{ex.id}] {_name(ex.tool)} {_name(ex.language)} {status}\n"
        f"    code: {cut(_flat(ex.code), r.exec_code_chars)}\n"
        f"    output: {cut(_flat(out), r.exec_output_chars)}"
    )


class _View(msgspec.Struct):
    """The evidence view while its sections are written: lines, the event ids they show, images."""

    traj: Trajectory
    rules: EvidenceRules
    get_blob: BlobGetter
    track: str | None
    grade: dict[str, Any] | None
    out: list[str] = []
    ids: set[str] = set()
    images: list[Image] = []


def _task(v: _View) -> None:
    traj = v.traj
    v.out.append("## Task")
    v.out.append(f"task: {_name(traj.task)}  track: {_name(v.track)}  tier: {_name(traj.tier)}")
    v.out.append(
        f"run status: {traj.status or 'no run.finished event'}  model calls: {len(traj.model_calls)}  "
        f"code executions: {len(traj.execs)}"
    )


def _conversation(v: _View) -> None:
    lines = _message_lines(v.traj, v.rules)
    v.out.append(f"## Conversation ({len(lines)} messages)")
    shown = budget_lines(lines, v.rules)
    v.out += shown
    # Each message is one line that starts with its own id; the agent's text cannot start a line.
    v.ids |= {i for line in shown for i in _ID_RE.findall(line)}


def _code_executions(v: _View) -> None:
    all_execs = v.traj.execs
    execs = select_execs(all_execs, v.rules)
    v.out.append(
        f"## Code executions ({len(all_execs)} total, {sum(1 for e in all_execs if e.ok is False)} "
        f"failed; {len(execs)} shown)"
    )
    for ex in execs:
        v.out.append(_exec_line(ex, v.rules))
        v.ids.add(ex.id)


def _files_written(v: _View) -> None:
    v.out.append("## Files written")
    last = {w.path: (ev_id, w) for ev_id, _, w in v.traj.writes}
    paths = sorted(last)
    for path in paths[:MAX_FILES]:
        ev_id, w = last[path]
        v.ids.add(ev_id)
        v.out.append(f"[{ev_id}] {_name(path)} ({w.size} bytes, {w.sha256[:19] or 'no digest'})")
    if len(paths) > MAX_FILES:
        v.out.append(f"... [{len(paths) - MAX_FILES} more files written, not listed] ...")


def _plan(v: _View) -> None:
    plan = v.traj.last_write("plan.md")
    if plan is None or plan[1].content is None:
        return
    try:
        text = v.get_blob(plan[1].content).decode("utf-8", "replace")
    except Exception as e:  # a missing blob is stated, not fatal: the view stays deterministic
        text = f"[plan content unavailable: {type(e).__name__}]"
    v.ids.add(plan[0])
    v.out.append(f"## plan.md [{plan[0]}]")
    shown = cut(text, v.rules.plan_chars)
    v.out.append(" " + shown if shown.startswith("[") else shown)  # a line of its own, not an event's


def _plan_png(v: _View) -> None:
    png = v.traj.last_write("plan.png")
    if png is None:
        return
    v.ids.add(png[0])
    data = b"" if png[1].size > PLAN_IMAGE_MAX else blob_or_empty(v.get_blob, png[1].content)
    size = max(png[1].size, len(data))  # (as recorded, or the blob's if that is larger)
    if size > PLAN_IMAGE_MAX:
        v.out.append(f"## plan.png [{png[0]}] {size} bytes: too large to look at (over 5 MiB)")
        return
    is_png, attach = data.startswith(PNG_MAGIC), v.rules.images
    v.out.append(
        f"## plan.png [{png[0]}] {'valid PNG' if is_png else 'not a readable PNG'}, {png[1].size} bytes"
        + ("; attached as an image" if is_png and attach else "")
    )
    if is_png and attach:
        v.images.append(Image(path=png[1].path, event_id=png[0], media_type="image/png", data=data))


def _submission(v: _View) -> None:
    traj, grade = v.traj, v.grade
    v.out.append("## Submission check")
    if traj.submission is None:
        v.out.append("no submission.sealed event: nothing was submitted")
    else:
        v.ids.add(traj.submission_id or "")
        v.out.append(
            f"[{traj.submission_id}] sealed {len(traj.submission.files)} files, "
            f"{len(traj.submission.skipped)} skipped"
        )
    if grade is not None:
        for key in sorted(grade):
            v.out.append(f"{_name(key, 0)}: {_name(str(grade[key]), 0)}")


def _task_metric(v: _View) -> None:
    grade = v.grade
    v.out.append("## Task metric")
    if grade is not None and grade.get("task_score") is not None:
        v.out.append(f"{grade.get('metric', 'metric')}: {grade['task_score']:.4f}")
    else:
        v.out.append(f"unscored: {_name(str(grade.get('reason')), 0) if grade else 'no grade'}")


SECTIONS: tuple[Callable[[_View], None], ...] = (
    *(_task, _conversation, _code_executions, _files_written),
    *(_plan, _plan_png, _submission, _task_metric),
)
"""The view's sections in order (docs/scoring.md, Evidence view)."""


def build(
    traj: Trajectory,
    rules: EvidenceRules,
    get_blob: BlobGetter,
    *,
    track: str | None,
    grade: dict[str, Any] | None,
) -> Evidence:
    """The evidence view of a run. ``grade`` is the task-metric summary (``scorer.taskgrade``)."""
    v = _View(traj, rules, get_blob, track, grade)
    for section in SECTIONS:
        section(v)
    # An agent's JSON may escape a lone surrogate, which is no UTF-8 text: shown escaped (``\\ud800``),
    # so that the digest and the judge's prompt can be made of it.
    text = ("\n".join(v.out) + "\n").encode("utf-8", "backslashreplace").decode("utf-8")
    h = hashlib.sha256(text.encode())
    for img in v.images:
        h.update(hashlib.sha256(img.data).digest())
    return Evidence(
        text=text, sha256="sha256:" + h.hexdigest(), images=v.images, cited_ids=sorted(i for i in v.ids if i)
    )
