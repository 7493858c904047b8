"""The sweep file: a typed schema (msgspec), validated with errors that name the field and the line.

The file's keys, with an example, are in docs/agents-and-sweeps.md (cells, agents, budgets) and
docs/scale-out.md (resources and executors).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import msgspec

from schemas.codec import check_id
from schemas.errors import AmbError, BadInput, SchemaError, UsageError
from schemas.events import BudgetLimits
from schemas.task_spec import TIERS, Tier
from schemas.userfile import read_text
from sweeps.executor import ExecutorConfig
from sweeps.spec import Agent as AgentDef
from sweeps.spec import GpuMode, TaskRef


class SweepError(UsageError):
    """A sweep file that cannot be run; the message names the file, the line and the field."""


class TaskEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str
    data: str | None = None


class AgentEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    command: list[str] | str
    model: str = ""
    upstream: list[str] | str = msgspec.field(default_factory=list)
    env: dict[str, str] = msgspec.field(default_factory=dict)


class ResourceRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Resources for the cells it matches (``agent``, ``task``, ``tier``; omitted = any)."""

    agent: str | None = None
    task: str | None = None
    tier: Tier | None = None
    cpus: float | None = None
    memory: str | None = None
    gpus: int | None = None
    time_limit_s: float | None = None


class SweepSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The sweep file's keys that a loaded sweep keeps as they are written."""

    tiers: list[Tier] = msgspec.field(default_factory=lambda: ["lite"])
    repeats: int = 1
    concurrency: int = 1
    time_limit_s: float | None = None
    max_attempts: int = 2
    backend: Literal["local", "docker", "auto"] = "local"
    cases: int = 3
    seed: int = 0
    profile: str | None = None
    judge: str | None = None
    score_jobs: int = 2
    judge_repeat: int = 1
    """With ``judge = "llm"``: ask every rubric item this many times (the report shows its stability)."""
    cpus: float | None = None
    memory: str | None = None
    gpus: int = 0
    gpu_mode: GpuMode = "nvidia"
    resources: list[ResourceRule] = msgspec.field(default_factory=list)
    executor: ExecutorConfig = msgspec.field(default_factory=ExecutorConfig)


class SweepFile(SweepSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A sweep file as written."""

    name: str
    agents: list[AgentEntry]
    tasks: list[str | TaskEntry]
    max_tokens: int | None = None
    max_cost: float | None = None
    max_calls: int | None = None
    price_table: str | None = None
    baseline: bool | None = None
    work: str | None = None


class SweepSpec(SweepSettings, frozen=True, kw_only=True):
    """A validated sweep file, its paths resolved."""

    name: str
    agents: list[AgentDef]
    tasks: list[TaskRef]
    baseline: bool
    work: Path
    source: Path | None = None
    budget: BudgetLimits | None = None
    """Per run: amb-record's --max-tokens/--max-cost/--max-calls (the sweep file's keys)."""


def line_of(text: str, path: list[str | int]) -> int | None:
    """The line (1-based) in TOML ``text`` where the value at ``path`` (keys and array indexes, as in
    msgspec's ``$.agents[0].name``) is written; the nearest enclosing one when not found."""
    lines = text.splitlines()
    header_re = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(#.*)?$")
    # Which lines belong to which table: (table name, index of [[array]] element, first line).
    sections: list[tuple[str, int, int]] = [("", 0, 0)]
    counts: dict[str, int] = {}
    for i, line in enumerate(lines):
        m = header_re.match(line)
        if m:
            name = m.group(1).replace('"', "").replace(" ", "")
            index = 0
            if line.strip().startswith("[["):
                index = counts[name] = counts.get(name, -1) + 1
            sections.append((name, index, i))
    found: int | None = None
    table, index = "", 0
    for part in path:
        if isinstance(part, int):
            index = part
            continue
        dotted = f"{table}.{part}" if table else part
        match = [s for s in sections if s[0] == dotted and s[1] == (index if dotted in counts else 0)]
        if match:
            found, table, index = match[0][2] + 1, dotted, 0
            continue
        # A key inside the current table: search from its header to the next header.
        start = next((s[2] for s in sections if s[0] == table and s[1] == index), 0)
        end = min([s[2] for s in sections if s[2] > start] or [len(lines)])
        key_re = re.compile(rf"^\s*\"?{re.escape(part)}\"?\s*=")
        for j in range(start, end):
            if key_re.match(lines[j]):
                found = j + 1
                break
        else:
            # An inline table or array element: keep the line of its enclosing key.
            break
        table, index = dotted, 0
    return found


def _path_of(message: str) -> list[str | int]:
    m = re.search(r"at `\$((?:\.[A-Za-z0-9_]+|\[\d+\])*)`", message)
    found = re.findall(r"\.([A-Za-z0-9_]+)|\[(\d+)\]", m.group(1)) if m else []
    parts: list[str | int] = [int(idx) if idx else key for key, idx in found]
    if u := re.search(r"unknown field `([^`]+)`", message):
        parts.append(u.group(1))
    return parts


def _error(where: str, text: str, path: list[str | int], message: str) -> SweepError:
    line = line_of(text, path)
    field_name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    at = f"{where}:{line}" if line else where
    return SweepError(f"{at}: {field_name or 'sweep file'}: {message}")


Fail = Callable[[list[str | int], str], SweepError]
"""Makes the error for a field of the sweep file (its path in the file, the message)."""


def _decode(path: Path) -> tuple[str, SweepFile]:
    """The file's text and its typed content; an error names the line of a field that is wrong."""
    where = str(path)
    try:
        text = read_text(path, "sweep file")
    except BadInput as e:  # unreadable, too large or not UTF-8: one usage error naming the file
        raise SweepError(str(e)) from None
    try:
        return text, msgspec.toml.decode(text.encode("utf-8"), type=SweepFile)
    except msgspec.ValidationError as e:
        msg = str(e)
        short = re.sub(r"\s*-\s*at `\$[^`]*`", "", msg)
        raise _error(where, text, _path_of(msg), short) from None
    except msgspec.DecodeError as e:
        raise SweepError(f"{where}: not valid TOML: {e}") from None


def _agents(raw: SweepFile, fail: Fail) -> list[AgentDef]:
    agents = []
    for i, a in enumerate(raw.agents):
        cmd = shlex.split(a.command) if isinstance(a.command, str) else list(a.command)
        if not cmd:
            raise fail(["agents", i, "command"], "must be a non-empty list of strings")
        if not a.name:
            raise fail(["agents", i, "name"], "must not be empty")
        upstream = [a.upstream] if isinstance(a.upstream, str) else list(a.upstream)
        agents.append(AgentDef(a.name, cmd, a.model, upstream, dict(a.env)))
    if not agents:
        raise fail(["agents"], "is empty")
    if len({a.name for a in agents}) != len(agents):
        raise fail(["agents"], "agent names must be unique")
    return agents


def _tasks(raw: SweepFile, folder: Path, fail: Fail) -> list[TaskRef]:
    """The tasks, each known to the registry; prepared data is resolved against the file's folder."""
    from tasks.registry import load_spec

    tasks = []
    for i, t in enumerate(raw.tasks):
        entry = TaskEntry(t) if isinstance(t, str) else t
        try:
            load_spec(entry.id)
        except AmbError as e:
            raise fail(["tasks", i], str(e)) from None
        data = None
        if entry.data:
            data = (folder / entry.data).resolve()
            if not (data / "public").is_dir():
                raise fail(["tasks", i, "data"], f"data {data} has no public/ folder")
        tasks.append(TaskRef(entry.id, data))
    if not tasks:
        raise fail(["tasks"], "is empty")
    return tasks


def _check_numbers(raw: SweepFile, fail: Fail) -> None:
    """Tiers, counts, the time limit and the budget's limits."""
    if not raw.tiers:
        raise fail(["tiers"], f"must list {' and/or '.join(TIERS)}")
    for key in ("repeats", "concurrency", "max_attempts", "cases", "score_jobs", "judge_repeat"):
        if getattr(raw, key) < 1:
            raise fail([key], "must be at least 1")
    if raw.time_limit_s is not None and raw.time_limit_s <= 0:
        raise fail(["time_limit_s"], "must be a positive number of seconds")
    for key in ("max_tokens", "max_cost", "max_calls"):
        value = getattr(raw, key)
        if value is not None and value <= 0:
            raise fail([key], "must be greater than 0")


def _budget(raw: SweepFile, fail: Fail) -> BudgetLimits | None:
    """Each run's budget (None: none), from the file's max_* keys and its price table."""
    if raw.max_tokens is not None or raw.max_cost is not None or raw.max_calls is not None:
        return BudgetLimits(
            max_tokens=raw.max_tokens,
            max_cost_usd=raw.max_cost,
            max_calls=raw.max_calls,
            price_table=raw.price_table,
        )
    if raw.price_table is not None:
        raise fail(["price_table"], "prices a budget: set max_cost (or max_tokens, max_calls) too")
    return None


def _check_resources(raw: SweepFile, agents: list[AgentDef], tasks: list[TaskRef], fail: Fail) -> None:
    """The sweep's CPUs and GPUs, and each resource rule's: positive, naming agents and tasks it has."""
    if raw.gpus < 0 or (raw.cpus is not None and raw.cpus <= 0):
        raise fail(["gpus" if raw.gpus < 0 else "cpus"], "must be positive")
    names = {a.name for a in agents}
    ids = {t.id for t in tasks}
    for i, r in enumerate(raw.resources):
        if r.agent is not None and r.agent not in names:
            raise fail(["resources", i, "agent"], f"no agent named {r.agent!r}")
        if r.task is not None and r.task not in ids:
            raise fail(["resources", i, "task"], f"task {r.task!r} is not in tasks")
        if (r.gpus or 0) < 0 or (r.cpus is not None and r.cpus <= 0):
            raise fail(["resources", i], "cpus and gpus must be positive")


def _baseline(raw: SweepFile, agents: list[AgentDef], fail: Fail) -> bool:
    """Whether the sweep runs the offline baseline server: as the file says, else when an agent's
    upstream names ``{baseline}``."""
    uses_baseline = [i for i, a in enumerate(agents) if any("{baseline}" in u for u in a.upstream)]
    if raw.baseline is False and uses_baseline:
        raise fail(
            ["agents", uses_baseline[0], "upstream"], "names {baseline}, but the sweep says baseline = false"
        )
    return bool(uses_baseline) if raw.baseline is None else raw.baseline


def load_sweep(path: Path, work: Path | None = None) -> SweepSpec:
    text, raw = _decode(path)

    def fail(fpath: list[str | int], message: str) -> SweepError:
        return _error(str(path), text, fpath, message)

    try:
        check_id("sweep name", raw.name)
    except SchemaError as e:
        raise fail(["name"], str(e)) from None
    agents = _agents(raw, fail)
    tasks = _tasks(raw, path.parent, fail)
    _check_numbers(raw, fail)
    budget = _budget(raw, fail)
    _check_resources(raw, agents, tasks, fail)
    if work is None:
        work = (path.parent / raw.work).resolve() if raw.work else Path.cwd() / f"sweep-{raw.name}"
    baseline = _baseline(raw, agents, fail)
    return SweepSpec(
        **{key: getattr(raw, key) for key in SweepSettings.__struct_fields__},
        name=raw.name,
        agents=agents,
        tasks=tasks,
        baseline=baseline,
        work=Path(work).resolve(),
        source=path,
        budget=budget,
    )
