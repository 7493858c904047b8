"""Sweeps: agents × tasks × tiers × repeats, each cell an independent ``amb-record`` run.

A sweep file (TOML)::

    name = "nightly"                 # run ids are <name>-<agent>-<task>-<tier>-r<k>
    tasks = ["kidney-seg", "bccd-det"]   # or [{id = "kidney-seg", data = "DIR"}] for prepared data
    tiers = ["lite", "standard"]
    repeats = 2
    concurrency = 2                  # cells recorded at the same time
    time_limit_s = 600               # per run (default: the task's own limit)
    max_calls = 200                  # per run budget, as amb-record --max-calls/--max-tokens/--max-cost
    max_attempts = 2                 # a failed cell is retried until it has used this many attempts
    backend = "local"                # or "docker", or "auto" (docker when an engine answers)
    cases = 3                        # twins synthesised for tasks without data (amb task synth)
    seed = 0
    baseline = true                  # start the offline baseline server; "{baseline}" in upstream is its URL

    [[agents]]
    name = "baseline"
    command = ["amb-agent", "--model", "{model}", "--task-dir", "{workspace}", "--data", "{data}"]
    model = "baseline"
    upstream = "openai={baseline}"   # optional: where the recording proxy forwards model calls

Placeholders in commands: ``{model} {workspace} {data} {task} {tier} {repeat} {run_id}``; ``{workspace}``
and ``{data}`` are the paths as the agent sees them (``/workspace`` and ``/data/public`` in a container).
A command starting with ``amb-agent`` runs the reference agent; in a container, whose image does not
carry amb, its single source file is passed to ``python3 -c``.

Resuming: a cell's state is read from its runs' own spools (``spool/<run-id>/recorder.spool``), not from
a side file, so a sweep killed at any point — even with ``kill -9`` — is resumed by running it again:
completed cells are skipped, cells whose runs failed are retried with a new attempt id
(``<run-id>.a2``, ``.a3``, ...) until ``max_attempts`` failed attempts, and attempts that were
interrupted (killed, or never finished) do not count against that limit. Each run stays its own shard
(spool and blobs), so cells can equally be fanned out over machines.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from schemas.codec import check_id, decode_event
from schemas.errors import AmbError, SchemaError, SpoolError, UsageError
from schemas.events import RunFinished
from schemas.frames import scan

TIERS = ("lite", "standard")
INTERRUPTED = ("killed", "unfinished")
"""Attempt outcomes that say the sweep (or the machine) stopped the run, not that the agent failed."""


class SweepError(UsageError):
    """A sweep file that cannot be run; the message names the file and the field."""


@dataclass(frozen=True)
class AgentDef:
    name: str
    command: list[str]
    model: str = ""
    upstream: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskDef:
    id: str
    data: Path | None = None


@dataclass
class SweepSpec:
    name: str
    agents: list[AgentDef]
    tasks: list[TaskDef]
    tiers: list[str]
    repeats: int
    concurrency: int
    time_limit_s: float | None
    max_attempts: int
    backend: str
    cases: int
    seed: int
    baseline: bool
    work: Path
    profile: str | None = None
    judge: str | None = None
    score_jobs: int = 2
    source: Path | None = None
    judge_repeat: int = 1
    budget_args: list[str] = field(default_factory=list)
    """amb-record's budget options from the sweep file's max_tokens, max_cost, max_calls, price_table."""
    """With ``judge = "llm"``: ask every rubric item this many times (the report shows its stability)."""


@dataclass
class Cell:
    sweep: str
    agent: AgentDef
    task: TaskDef
    tier: str
    repeat: int
    state: str = "pending"
    """pending, running, completed, failed (will retry), gave_up."""
    attempts: list[tuple[str, str]] = field(default_factory=list)
    """(run id, outcome) of every attempt so far, oldest first."""
    skipped: bool = False
    """Completed before this invocation (a resumed sweep leaves it alone)."""

    @property
    def base_id(self) -> str:
        return f"{_slug(self.sweep)}-{_slug(self.agent.name)}-{self.task.id}-{self.tier}-r{self.repeat}"

    def attempt_id(self, n: int) -> str:
        return self.base_id if n == 1 else f"{self.base_id}.a{n}"

    @property
    def final_run(self) -> str | None:
        done = [r for r, o in self.attempts if o == "completed"]
        if done:
            return done[0]
        return self.attempts[-1][0] if self.attempts else None

    def failures(self) -> int:
        return sum(1 for _, o in self.attempts if o not in INTERRUPTED and o != "completed")


@dataclass
class SweepOutcome:
    cells: list[Cell]
    interrupted: bool
    data_roots: dict[str, Path]
    wall_s: float = 0.0

    @property
    def final_runs(self) -> list[str]:
        return [c.final_run for c in self.cells if c.final_run]

    @property
    def gave_up(self) -> list[Cell]:
        return [c for c in self.cells if c.state == "gave_up"]

    def summary(self) -> str:
        n = len(self.cells)
        done = sum(1 for c in self.cells if c.state == "completed")
        skipped = sum(1 for c in self.cells if c.skipped)
        runs = sum(len(c.attempts) for c in self.cells)
        return (
            f"{done}/{n} cells completed ({skipped} already done before this run), "
            f"{len(self.gave_up)} gave up, {runs} runs recorded in all, {self.wall_s:.1f}s"
        )

    def runs_by_references(self) -> dict[Path, list[str]]:
        out: dict[Path, list[str]] = {}
        for c in self.cells:
            if c.final_run:
                out.setdefault(self.data_roots[c.task.id], []).append(c.final_run)
        return out

    def as_dict(self) -> dict:
        return {
            "cells": [
                {
                    "agent": c.agent.name,
                    "model": c.agent.model,
                    "task": c.task.id,
                    "tier": c.tier,
                    "repeat": c.repeat,
                    "state": c.state,
                    "final_run": c.final_run,
                    "attempts": [{"run_id": r, "outcome": o} for r, o in c.attempts],
                }
                for c in self.cells
            ],
            "interrupted": self.interrupted,
        }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", text)


# ---- the sweep file -------------------------------------------------------------------------------

_BUDGET_KEYS = {"max_tokens": "--max-tokens", "max_cost": "--max-cost", "max_calls": "--max-calls"}
_KEYS = {
    "price_table",
    "name",
    "agents",
    "tasks",
    "tiers",
    "repeats",
    "concurrency",
    "time_limit_s",
    "max_attempts",
    "backend",
    "cases",
    "seed",
    "baseline",
    "work",
    "profile",
    "judge",
    "score_jobs",
    "judge_repeat",
    *_BUDGET_KEYS,
}
_AGENT_KEYS = {"name", "command", "model", "upstream", "env"}


def load_sweep(path: Path, work: Path | None = None) -> SweepSpec:
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SweepError(f"{where}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{where}: not valid TOML: {e}") from None
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise SweepError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")

    def need(key, kind, default=None):
        value = raw.get(key, default)
        if value is None:
            raise SweepError(f"{where}: '{key}' is required")
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise SweepError(f"{where}: '{key}' must be {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    name = need("name", str)
    try:
        check_id("sweep name", name)
    except SchemaError as e:
        raise SweepError(f"{where}: {e}") from None
    agents = []
    for i, a in enumerate(need("agents", list)):
        if not isinstance(a, dict):
            raise SweepError(f"{where}: agents[{i}] must be a table")
        bad = sorted(set(a) - _AGENT_KEYS)
        if bad:
            raise SweepError(
                f"{where}: agents[{i}]: unknown key(s) {', '.join(bad)} "
                f"(known: {', '.join(sorted(_AGENT_KEYS))})"
            )
        cmd = a.get("command")
        if isinstance(cmd, str):
            import shlex

            cmd = shlex.split(cmd)
        if not cmd or not all(isinstance(c, str) for c in cmd):
            raise SweepError(f"{where}: agents[{i}]: 'command' must be a non-empty list of strings")
        aname = a.get("name")
        if not isinstance(aname, str) or not aname:
            raise SweepError(f"{where}: agents[{i}]: 'name' is required")
        upstream = a.get("upstream", [])
        upstream = [upstream] if isinstance(upstream, str) else upstream
        if not isinstance(upstream, list) or not all(isinstance(u, str) for u in upstream):
            raise SweepError(f"{where}: agents[{i}]: 'upstream' must be a string or a list of strings")
        env = a.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise SweepError(f"{where}: agents[{i}]: 'env' must be a table of strings")
        agents.append(AgentDef(aname, list(cmd), str(a.get("model", "")), upstream, dict(env)))
    if not agents:
        raise SweepError(f"{where}: 'agents' is empty")
    if len({a.name for a in agents}) != len(agents):
        raise SweepError(f"{where}: agent names must be unique")
    from tasks.registry import load_spec

    tasks = []
    for i, t in enumerate(need("tasks", list)):
        if isinstance(t, str):
            t = {"id": t}
        if not isinstance(t, dict) or not isinstance(t.get("id"), str) or set(t) - {"id", "data"}:
            raise SweepError(f"{where}: tasks[{i}] must be a task id or a table {{id = ..., data = ...}}")
        try:
            load_spec(t["id"])
        except AmbError as e:
            raise SweepError(f"{where}: tasks[{i}]: {e}") from None
        data = None
        if t.get("data"):
            data = (path.parent / t["data"]).resolve()
            if not (data / "public").is_dir():
                raise SweepError(f"{where}: tasks[{i}]: data {data} has no public/ folder")
        tasks.append(TaskDef(t["id"], data))
    if not tasks:
        raise SweepError(f"{where}: 'tasks' is empty")
    tiers = need("tiers", list, ["lite"])
    if not tiers or any(t not in TIERS for t in tiers):
        raise SweepError(f"{where}: 'tiers' must list lite and/or standard, got {tiers!r}")
    ints = {
        k: need(k, int, d)
        for k, d in (
            ("repeats", 1),
            ("concurrency", 1),
            ("max_attempts", 2),
            ("cases", 3),
            ("seed", 0),
            ("score_jobs", 2),
            ("judge_repeat", 1),
        )
    }
    for k in ("repeats", "concurrency", "max_attempts", "cases", "score_jobs", "judge_repeat"):
        if ints[k] < 1:
            raise SweepError(f"{where}: '{k}' must be at least 1")
    limit = raw.get("time_limit_s")
    if limit is not None and (not isinstance(limit, (int, float)) or isinstance(limit, bool) or limit <= 0):
        raise SweepError(f"{where}: 'time_limit_s' must be a positive number of seconds")
    budget_args: list[str] = []
    for key, flag in _BUDGET_KEYS.items():
        value = raw.get(key)
        if value is not None:
            kinds = (int, float) if key == "max_cost" else (int,)
            if not isinstance(value, kinds) or isinstance(value, bool) or value <= 0:
                raise SweepError(
                    f"{where}: '{key}' must be a positive {'number' if key == 'max_cost' else 'integer'}"
                )
            budget_args += [flag, str(value)]
    if raw.get("price_table") is not None:
        budget_args += ["--price-table", need("price_table", str, "")]
    backend = need("backend", str, "local")
    if backend not in ("local", "docker", "auto"):
        raise SweepError(f"{where}: 'backend' must be local, docker or auto")
    if work is None:
        work = (path.parent / raw["work"]).resolve() if raw.get("work") else Path.cwd() / f"sweep-{name}"
    return SweepSpec(
        name=name,
        agents=agents,
        tasks=tasks,
        tiers=list(tiers),
        repeats=ints["repeats"],
        concurrency=ints["concurrency"],
        time_limit_s=float(limit) if limit is not None else None,
        max_attempts=ints["max_attempts"],
        backend=backend,
        cases=ints["cases"],
        seed=ints["seed"],
        baseline=bool(raw.get("baseline", any("{baseline}" in u for a in agents for u in a.upstream))),
        work=Path(work).resolve(),
        profile=raw.get("profile"),
        judge=raw.get("judge"),
        score_jobs=ints["score_jobs"],
        source=path,
        judge_repeat=ints["judge_repeat"],
        budget_args=budget_args,
    )


# ---- state from the store -------------------------------------------------------------------------


def attempt_outcome(store: Path, run_id: str) -> str | None:
    """How an attempt ended, from its own recorder spool: the run.finished status, ``unfinished``
    when it started but never finished (killed hard), None when it never started."""
    path = store / "spool" / run_id / "recorder.spool"
    if not path.exists():
        return None
    try:
        bodies = scan(path.read_bytes(), str(path)).bodies
    except (OSError, SpoolError):
        return "unfinished"
    for body in reversed(bodies):
        try:
            event = decode_event(body)
        except Exception:
            continue
        if isinstance(event.payload, RunFinished):
            return event.payload.status
    return "unfinished" if bodies else None


def plan_cells(spec: SweepSpec, store: Path) -> list[Cell]:
    cells = []
    for agent in spec.agents:
        for task in spec.tasks:
            for tier in spec.tiers:
                for k in range(1, spec.repeats + 1):
                    cell = Cell(spec.name, agent, task, tier, k)
                    n = 1
                    while True:
                        outcome = attempt_outcome(store, cell.attempt_id(n))
                        if outcome is None:
                            break
                        cell.attempts.append((cell.attempt_id(n), outcome))
                        n += 1
                    if any(o == "completed" for _, o in cell.attempts):
                        cell.state, cell.skipped = "completed", True
                    elif cell.failures() >= spec.max_attempts:
                        cell.state = "gave_up"
                    cells.append(cell)
    for c in cells:
        check_id("run id", c.attempt_id(len(c.attempts) + 1))
    return cells


# ---- running --------------------------------------------------------------------------------------


def docker_ready() -> tuple[bool, str]:
    """Whether the docker backend can run here: an engine answers and the agent image exists."""
    image = os.environ.get("AMB_AGENT_IMAGE") or "amb-agent:latest"
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
    except Exception:
        return False, "no Docker engine answers"
    try:
        client.images.get(image)
    except Exception:
        return False, f"a Docker engine answers but there is no {image} image (amb images build)"
    return True, "a Docker engine answers"


def prepare_data(spec: SweepSpec, log) -> dict[str, Path]:
    """Each task's data root (with public/ and private/): given, or a twin synthesised once."""
    from tasks.registry import load_spec
    from tasks.synth import synth

    roots: dict[str, Path] = {}
    for t in spec.tasks:
        if t.data is not None:
            roots[t.id] = t.data
            continue
        out = spec.work / "data" / t.id
        stamp = out / ".synth"
        want = f"{t.id} cases={spec.cases} seed={spec.seed}"
        if not (stamp.is_file() and stamp.read_text() == want):
            if out.exists():
                shutil.rmtree(out)
            log(f"synthesising {t.id} ({spec.cases} cases, seed {spec.seed})")
            out.mkdir(parents=True)
            synth(load_spec(t.id), out, cases=spec.cases, seed=spec.seed)
            stamp.write_text(want)
        roots[t.id] = spec.work / "data"
    return roots


def agent_argv(agent: AgentDef, backend: str, values: dict[str, str]) -> list[str]:
    cmd = [c.format_map(_Missing(values)) for c in agent.command]
    if cmd[0] == "amb-agent":
        if backend == "docker":
            from agents import amb_agent

            cmd = ["python3", "-c", Path(amb_agent.__file__).read_text(encoding="utf-8")] + cmd[1:]
        else:
            exe = Path(sys.executable).with_name("amb-agent")
            cmd = [str(exe) if exe.exists() else (shutil.which("amb-agent") or "amb-agent")] + cmd[1:]
    return cmd


class _Missing(dict):
    def __missing__(self, key):
        raise SweepError(
            f"unknown placeholder {{{key}}} in an agent command (known: model, workspace, data, task, "
            "tier, repeat, run_id)"
        )


def _record_exe() -> str:
    exe = Path(sys.executable).with_name("amb-record")
    return str(exe) if exe.exists() else (shutil.which("amb-record") or "amb-record")


@dataclass
class _Running:
    cell: Cell
    run_id: str
    proc: subprocess.Popen
    log: BinaryIO
    started: float


TableRenderer = Callable[[Sequence[str], Sequence[Sequence[Any]]], str]
"""Draws rows under column names as aligned text (the CLI's one renderer, ``amb.output.table``)."""


def run_sweep(spec: SweepSpec, store: Path, *, render_table: TableRenderer, out=None) -> SweepOutcome:
    """Run every cell not yet completed; returns when all are done, or at the first interrupt."""
    out = out or sys.stderr
    t0 = time.monotonic()
    store = Path(store).resolve()
    spec.work.mkdir(parents=True, exist_ok=True)
    (spec.work / "logs").mkdir(exist_ok=True)
    (spec.work / "workspaces").mkdir(exist_ok=True)
    show = _Progress(out, render_table)
    backend = spec.backend
    if backend == "auto":
        ok, why = docker_ready()
        backend = "docker" if ok else "local"
        show.line(f"backend: {backend} ({why})")
    roots = prepare_data(spec, show.line)
    cells = plan_cells(spec, store)
    skipped = sum(1 for c in cells if c.skipped)
    if any(c.attempts for c in cells):
        show.line(
            f"resuming: {skipped} of {len(cells)} cells already completed, "
            f"{sum(1 for c in cells if c.state == 'gave_up')} gave up earlier"
        )
    server = None
    if spec.baseline and any(c.state == "pending" for c in cells):
        from agents.baseline.server import BaselineServer

        server = BaselineServer().start()
        show.line(f"baseline server on {server.url}")
    stop = threading.Event()
    previous = {}

    def on_signal(signum, _frame):
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    running: list[_Running] = []
    try:
        queue = [c for c in cells if c.state == "pending"]
        while (queue or running) and not stop.is_set():
            while queue and len(running) < spec.concurrency and not stop.is_set():
                cell = queue.pop(0)
                running.append(_launch(spec, cell, store, backend, roots, server))
                cell.state = "running"
            for r in list(running):
                if r.proc.poll() is None:
                    continue
                running.remove(r)
                r.log.close()
                outcome = attempt_outcome(store, r.run_id) or "failed"
                r.cell.attempts.append((r.run_id, outcome))
                if outcome == "completed":
                    r.cell.state = "completed"
                elif r.cell.failures() >= spec.max_attempts:
                    r.cell.state = "gave_up"
                elif stop.is_set() and outcome in INTERRUPTED:
                    r.cell.state = "pending"
                else:
                    r.cell.state = "failed"
                    queue.append(r.cell)  # retry at the end of the queue
                show.event(r.cell, r.run_id, outcome, time.monotonic() - r.started)
            show.table(cells)
            time.sleep(0.1)
    finally:
        if running:
            show.line(f"stopping {len(running)} running cell(s)")
            for r in running:
                try:
                    os.killpg(r.proc.pid, signal.SIGTERM)  # amb-record forwards it and closes the run
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 30
            for r in running:
                try:
                    r.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(r.proc.pid, signal.SIGKILL)
                    r.proc.wait()
                r.log.close()
                outcome = attempt_outcome(store, r.run_id) or "unfinished"
                r.cell.attempts.append((r.run_id, outcome))
                r.cell.state = "completed" if outcome == "completed" else "pending"
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.stop()
        show.table(cells, final=True)
    return SweepOutcome(cells, stop.is_set(), roots, time.monotonic() - t0)


def _launch(
    spec: SweepSpec, cell: Cell, store: Path, backend: str, roots: dict[str, Path], server
) -> _Running:
    n = len(cell.attempts) + 1
    run_id = cell.attempt_id(n)
    data_root = cell.task.data or spec.work / "data" / cell.task.id
    workspace = spec.work / "workspaces" / run_id
    if workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True)
    if backend == "local":
        from tasks.registry import brief

        # The docker backend places the brief itself; locally the workspace is the agent's cwd.
        (workspace / "tier_prompt.txt").write_text(brief(cell.task.id, cell.tier), encoding="utf-8")
        seen_ws, seen_data = str(workspace), str(data_root / "public")
    else:
        seen_ws, seen_data = "/workspace", "/data/public"
    values = {
        "model": cell.agent.model,
        "workspace": seen_ws,
        "data": seen_data,
        "task": cell.task.id,
        "tier": cell.tier,
        "repeat": str(cell.repeat),
        "run_id": run_id,
    }
    argv = [
        _record_exe(),
        "--store",
        str(store),
        "--task",
        cell.task.id,
        "--tier",
        cell.tier,
        "--data",
        str(data_root),
        "--backend",
        backend,
        "--run-id",
        run_id,
        "--agent",
        cell.agent.name,
        "--label",
        f"sweep={spec.name}",
        "--label",
        f"agent={cell.agent.name}",
        "--label",
        f"repeat={cell.repeat}",
        "--label",
        f"attempt={n}",
    ]
    if backend == "local":
        # Record processes and file changes as a container run would, so that scores do not
        # depend on the backend (the offline judge reads plan writes and pilot checks from them).
        argv.append("--shim")
    if cell.agent.model:
        argv += ["--model", cell.agent.model, "--label", f"model={cell.agent.model}"]
    limit = spec.time_limit_s
    if limit is None:
        from tasks.registry import load_spec

        limit = float(load_spec(cell.task.id).time_limit_s)
    argv += ["--time-limit", f"{limit:g}", *spec.budget_args]
    for up in cell.agent.upstream:
        if "{baseline}" in up and server is None:
            raise SweepError(
                f"agent {cell.agent.name}: upstream {up!r} needs the baseline server (baseline = true)"
            )
        argv += ["--upstream", up.replace("{baseline}", server.url if server else "")]
    argv += ["--", *agent_argv(cell.agent, backend, values)]
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(cell.agent.env)
    log = open(spec.work / "logs" / f"{run_id}.log", "wb")
    proc = subprocess.Popen(
        argv,
        cwd=workspace,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=_term_with_parent,
    )
    return _Running(cell, run_id, proc, log, time.monotonic())


def _term_with_parent() -> None:
    # If the sweep itself is killed (kill -9), its amb-record children get SIGTERM, close their runs
    # as killed and exit, so a resumed sweep never races a leftover attempt (Linux; a no-op elsewhere).
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Progress:
    """A live table on a terminal; one line per finished run otherwise."""

    def __init__(self, out, render_table: TableRenderer):
        self.out = out
        self.render_table = render_table
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.drawn = 0
        self.last = ""

    def line(self, text: str) -> None:
        self._clear()
        print(f"amb sweep: {text}", file=self.out, flush=True)

    def event(self, cell: Cell, run_id: str, outcome: str, took: float) -> None:
        self._clear()
        print(f"amb sweep: {run_id}: {outcome} ({took:.1f}s)", file=self.out, flush=True)

    def table(self, cells: list[Cell], final: bool = False) -> None:
        groups: dict[tuple[str, str, str], dict[str, int]] = {}
        for c in cells:
            g = groups.setdefault((c.agent.name, c.task.id, c.tier), {})
            g[c.state] = g.get(c.state, 0) + 1
        states = ("completed", "running", "pending", "failed", "gave_up")
        rows = [(a, t, tier, *(g.get(s, 0) for s in states)) for (a, t, tier), g in groups.items()]
        text = self.render_table(("agent", "task", "tier", *states), rows)
        if self.tty and not final:
            if text != self.last:
                self._clear()
                print(text, file=self.out, flush=True)
                self.drawn = text.count("\n") + 1
                self.last = text
        elif final:
            self._clear()
            print(text, file=self.out, flush=True)

    def _clear(self) -> None:
        if self.tty and self.drawn:
            self.out.write(f"\x1b[{self.drawn}A\x1b[J")
            self.drawn = 0
            self.last = ""
