"""The baseline's "model": a deterministic scripted policy that does honest work, one track at a time.

Given a chat request (the whole conversation so far), ``decide`` returns the next assistant turn.
Nothing is remembered between requests: the policy reads the conversation, as a model would. The
system prompt tells it the task (the brief's title), the tier and where the data is; each earlier
tool call names its step in its first line (``# S3 pilot: ...``) and each tool result says how it
went (exit code, printed ``CASE``/``RESULT``/``CHECK`` lines). From those it picks the next step
(each is written by ``agents.baseline.steps``):

    explore → plan → env → setup → inspect → pilot → pilot_check → batch [→ batch_retry] → verify → submit

A failed step is retried once; a batch that left cases without output is re-run on the missing
cases once. ``flaw`` injects one of the failures AutoMedBench's error taxonomy is made of
(``FLAWS``; what each does and costs: docs/agents-and-sweeps.md).
"""

from __future__ import annotations

import json
import re

from agents.baseline.context import Context, Decision, Step, json_line
from agents.baseline.steps import STEPS
from schemas.providers import openai_chat
from schemas.providers.conversation import Conversation, Kind, args_object
from schemas.task_spec import TaskSpec

FLAWS = ("no-pilot", "wrong-filename", "crash-mid-batch", "hand-written", "private-path")
STEP_RE = re.compile(r"^#\s*(S\d)\s+([a-z_]+)\b")
DATA_RE = re.compile(r"^Task data \(read-only\):\s*(\S+)\s*$", re.M)
TIER_RE = re.compile(r"^Tier:\s*(lite|standard)\s*$", re.M)


class PolicyError(ValueError):
    """The conversation gives the policy nothing to act on (no brief it recognises)."""


# ---- reading the conversation ---------------------------------------------------------------------


def identify_task(system: str, data: str) -> tuple[TaskSpec, str | None]:
    """The task (and tier) whose brief the system prompt carries.

    Briefs name the container's data folder; an agent run elsewhere points them at its own, so that
    is undone before comparing. The whole brief is looked for first, then its title line alone.
    """
    from tasks.registry import all_specs, brief

    text = system.replace(data.rstrip("/"), "/data/public") if data else system
    by_title = []
    for spec in all_specs():
        for tier in ("lite", "standard"):
            try:
                body = brief(spec.id, tier).strip()
            except Exception:
                continue
            if body and body in text:
                return spec, tier
            title = body.splitlines()[0] if body else ""
            if title and re.search(rf"^{re.escape(title)}\s*$", text, re.M):
                by_title.append((spec, tier))
    if by_title:
        return by_title[0]
    raise PolicyError("the system prompt carries no task brief this baseline knows")


def _history(conv: Conversation) -> list[Step]:
    results = {p.id: p.text for m in conv.messages if m.role == "tool" for p in m.parts}
    calls = [p for m in conv.messages if m.role == "assistant" for p in m.parts if p.kind == Kind.TOOL_CALL]
    steps = []
    for call in calls:
        match = STEP_RE.match(str(args_object(call.arguments)[0].get("code", "")).lstrip())
        step = "submit" if call.name == "submit_results" else match.group(2) if match else "other"
        raw = results.get(call.id)
        code, out = None, raw or ""
        if raw is not None:
            try:
                parsed = json.loads(raw)
                code = parsed.get("exit_code")
                out = (parsed.get("stdout") or "") + "\n" + (parsed.get("stderr") or "")
            except (ValueError, AttributeError):
                code = 0 if "ACCEPTED" in raw else None
        steps.append(Step(step, code, out))
    return steps


# ---- the plan of work -----------------------------------------------------------------------------


def _sequence(flaw: str | None) -> list[str]:
    if flaw == "hand-written":
        return ["explore", "plan", "env", "setup", "inspect", "handwrite", "verify", "submit"]
    seq = ["explore", "plan", "env", "setup", "inspect", "pilot", "pilot_check", "batch", "verify", "submit"]
    if flaw == "no-pilot":
        seq = [s for s in seq if s not in ("pilot", "pilot_check")]
    if flaw == "private-path":
        seq.insert(1, "peek_reference")
    return seq


def decide(messages: list[dict], flaw: str | None = None) -> Decision:
    if flaw is not None and flaw not in FLAWS:
        raise PolicyError(f"unknown flaw {flaw!r} (known: {', '.join(FLAWS)})")
    conv = openai_chat.conversation({"messages": messages})
    system = "\n".join(m.text for m in conv.messages if m.role == "system")
    if not system and conv.messages:
        system = conv.messages[0].text
    data_m = DATA_RE.search(system)
    data = (data_m.group(1) if data_m else "/data/public").rstrip("/")
    spec, brief_tier = identify_task(system, data)
    tier_m = TIER_RE.search(system)
    tier = tier_m.group(1) if tier_m else (brief_tier or "lite")
    steps = _history(conv)
    ctx = Context(spec, data, tier, flaw, steps)
    if steps and steps[-1].name == "submit":
        return Decision("The results are submitted; the task is complete.")
    nxt = _next_step(ctx)
    return STEPS[nxt](ctx)


def _next_step(ctx: Context) -> str:
    steps, seq = ctx.steps, _sequence(ctx.flaw)
    if not steps:
        return seq[0]
    last = steps[-1]
    names = [s.name for s in steps]

    def after(name: str) -> str:
        return seq[seq.index(name) + 1] if name in seq and seq.index(name) + 1 < len(seq) else "submit"

    if last.name == "batch":
        result = json_line(last.output, "RESULT")
        if ctx.flaw != "crash-mid-batch" and (last.exit_code != 0 or (result and result.get("failed"))):
            return "batch_retry"  # re-run the cases that have no output yet
        return after("batch")
    if last.name == "batch_retry":
        return after("batch")
    if (
        last.exit_code not in (0, None)
        and last.name in seq
        and names.count(last.name) == 1
        and last.name != "peek_reference"
    ):
        return last.name  # one more try of a step that failed
    return after(last.name)
