"""Running a sweep: plan the cells, write each attempt's run spec, hand the specs to an executor, watch
the shard root, retry failed and lost attempts, bring complete shards into the store.

A cell's state is read from the shard root (``sweeps.state``), not from a side file, so a sweep
stopped at any point (Ctrl-C, ``kill -9``, a dead node) is resumed by running it again; the rules
are in docs/scale-out.md (Exactly once in effect).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import msgspec

from schemas.durable import write_durably
from schemas.errors import UsageError
from sweeps.executor import Executor, ExecutorName, attach, hold_driver_mark, open_executor
from sweeps.plan import SweepSpec
from sweeps.progress import Progress
from sweeps.shard import Layout, write_spec
from sweeps.spec import Backend, CellLimits, RunSpec
from sweeps.state import INTERRUPTED, CellState, cell_dict, next_attempt, read_cell

LOST_AFTER_S = 5.0
"""An attempt the engine says has ended but whose shard is not there this long after is lost (a
shared filesystem may show a rename to other nodes a little later)."""


@dataclass
class SweepOutcome:
    cells: list[CellState]
    interrupted: bool
    data_roots: dict[str, Path]
    wall_s: float = 0.0
    dispatch: dict[str, float] | None = None
    """Run id -> when the executor started it (time.time()), where the executor knows."""

    @property
    def final_runs(self) -> list[str]:
        return [r for c in self.cells if (r := c.final_run)]

    @property
    def gave_up(self) -> list[CellState]:
        return [c for c in self.cells if c.state == "gave_up"]

    def summary(self) -> str:
        n = len(self.cells)
        done = sum(1 for c in self.cells if c.state == "completed")
        skipped = sum(1 for c in self.cells if c.skipped)
        runs = sum(1 for c in self.cells for _, o in c.attempts if o != "lost")
        dups = sum(len(c.duplicates) for c in self.cells)
        return (
            f"{done}/{n} cells completed ({skipped} already done before this run), "
            f"{len(self.gave_up)} gave up, {runs} runs recorded in all"
            + (f", {dups} duplicate(s) kept aside" if dups else "")
            + f", {self.wall_s:.1f}s"
        )

    def runs_by_references(self) -> dict[Path, list[str]]:
        out: dict[Path, list[str]] = {}
        for c in self.cells:
            if c.final_run:
                out.setdefault(self.data_roots[c.task.id], []).append(c.final_run)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"cells": [cell_dict(c) for c in self.cells], "interrupted": self.interrupted}


def plan_cells(spec: SweepSpec, layout: Layout) -> list[CellState]:
    from schemas.codec import check_id

    cells = []
    for agent in spec.agents:
        for task in spec.tasks:
            for tier in spec.tiers:
                for k in range(1, spec.repeats + 1):
                    cell = CellState(spec.name, agent, task, tier, k)
                    read_cell(layout, cell, spec.max_attempts)
                    cell.skipped = cell.state == "completed"
                    check_id("run id", cell.attempt_id(next_attempt(cell)))
                    cells.append(cell)
    return cells


def docker_ready() -> tuple[bool, str]:
    image = os.environ.get("AMB_AGENT_IMAGE") or "amb-agent:latest"
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
    except Exception:  # any failure to reach the engine means: no docker here
        return False, "no Docker engine answers"
    try:
        client.images.get(image)
    except Exception:  # a missing image or an engine error alike
        return False, f"a Docker engine answers but there is no {image} image (amb images build)"
    return True, "a Docker engine answers"


def prepare_data(spec: SweepSpec, log: Callable[[str], None]) -> dict[str, Path]:
    """Each task's references root (the folder holding ``<task>/private``): given, or twins
    synthesised once under ``<work>/data``."""
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


def limits_for(spec: SweepSpec, cell: CellState) -> CellLimits:
    """The sweep's defaults, then every ``[[resources]]`` rule matching the cell, in order."""
    cpus, memory, gpus, limit = spec.cpus, spec.memory, spec.gpus, spec.time_limit_s
    for r in spec.resources:
        if (r.agent or cell.agent.name) != cell.agent.name or (r.task or cell.task.id) != cell.task.id:
            continue
        if (r.tier or cell.tier) != cell.tier:
            continue
        cpus = r.cpus if r.cpus is not None else cpus
        memory = r.memory if r.memory is not None else memory
        gpus = r.gpus if r.gpus is not None else gpus
        limit = r.time_limit_s if r.time_limit_s is not None else limit
    if limit is None:
        from tasks.registry import load_spec

        limit = float(load_spec(cell.task.id).time_limit_s)
    return CellLimits(time_limit_s=float(limit), cpus=cpus, memory=memory, gpus=gpus, budget=spec.budget)


def resolve_backend(spec: SweepSpec, log: Callable[[str], None]) -> Backend:
    if spec.backend != "auto":
        return spec.backend
    ok, why = docker_ready()
    backend: Backend = "docker" if ok else "local"
    log(f"backend: {backend} ({why})")
    return backend


def write_specs(
    spec: SweepSpec, cells: list[CellState], layout: Layout, backend: Backend
) -> list[tuple[str, CellState, Path]]:
    """Write the next attempt's spec of every pending cell: (run id, cell, spec file); nothing is
    submitted."""
    out = []
    for cell in cells:
        if cell.state not in ("pending", "failed"):
            continue
        n = next_attempt(cell)
        data = cell.task.data or spec.work / "data" / cell.task.id
        run = RunSpec(
            cell=cell.cell,
            attempt=n,
            agent=cell.agent,
            limits=limits_for(spec, cell),
            backend=backend,
            data=str(Path(data).resolve()),
            shard_root=str(spec.work),
            gpu_mode=spec.gpu_mode,
        )
        out.append((cell.attempt_id(n), cell, write_spec(layout, run)))
    return out


def run_sweep(
    spec: SweepSpec,
    store: Path,
    *,
    executor: ExecutorName | None = None,
    out: TextIO | None = None,
    ingest_into_store: Callable[[Path, list[Path]], None] | None = None,
) -> SweepOutcome:
    """Run every cell not yet completed; returns when all are done, or at the first interrupt.

    ``ingest_into_store(store, shard_dirs)`` brings complete shards into the store as they land
    (the CLI passes ``replay.shards.load_shards``; None leaves them in the shard root).
    """
    layout = Layout(spec.work)
    layout.make()
    mark = hold_driver_mark(layout)  # held while this process drives the sweep (``is_driver``)
    try:
        return _drive(spec, store, layout, executor, out or sys.stderr, ingest_into_store)
    finally:
        os.close(mark)


def _drive(
    spec: SweepSpec,
    store: Path,
    layout: Layout,
    executor: ExecutorName | None,
    out: TextIO,
    ingest_into_store: Callable[[Path, list[Path]], None] | None,
) -> SweepOutcome:
    t0 = time.monotonic()
    progress = Progress(out)
    backend = resolve_backend(spec, progress.line)
    roots = prepare_data(spec, progress.line)
    cells = plan_cells(spec, layout)
    if any(c.attempts for c in cells):
        progress.line(
            f"resuming: {sum(1 for c in cells if c.skipped)} of {len(cells)} cells already completed, "
            f"{sum(1 for c in cells if c.state == 'gave_up')} gave up earlier"
        )
    config = spec.executor
    if executor is not None and executor != config.name:
        config = msgspec.structs.replace(config, name=executor)
    _write_plan(layout, spec, cells, config.name)
    adopted, previous_ex = _adopt(layout, config.name, cells)
    ex: Executor = open_executor(config, layout, concurrency=spec.concurrency)
    flight = _InFlight(spec, layout, backend, progress, ex, previous_ex, adopted)
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    ingest = ingest_into_store or (lambda _store, _landed: None)
    try:
        flight.submit([c for c in cells if c.state == "pending"])
        progress.start(cells)
        while flight.cells and not stop.is_set():
            landed, retry = flight.collect()
            if landed:
                ingest(store, landed)
            flight.submit(retry)
            progress.update(cells)
            time.sleep(0.2)
    finally:
        if flight.cells:
            flight.wind_down(lambda landed: ingest(store, landed))
        dispatch = flight.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        progress.stop(cells)
    return SweepOutcome(cells, stop.is_set(), roots, time.monotonic() - t0, dispatch)


def _write_plan(layout: Layout, spec: SweepSpec, cells: list[CellState], executor: str) -> None:
    from sweeps.status import PLAN_FILE, Plan

    plan = Plan(
        name=spec.name,
        max_attempts=spec.max_attempts,
        agents={a.name: a for a in spec.agents},
        cells=[c.cell for c in cells],
        executor=executor,
    )
    write_durably(layout.root / PLAN_FILE, msgspec.json.encode(plan))


def _adopt(layout: Layout, name: str, cells: list[CellState]) -> tuple[dict[str, CellState], Executor | None]:
    """Attempts the previous executor of this root still runs: waited for, not submitted again.
    Returns them and that executor, attached, to poll them with (None when nothing is adopted)."""
    previous = attach(layout)
    if previous is None or previous.name != name:
        return {}, None
    live = {rid for rid, st in previous.poll().items() if st in ("queued", "running")}
    if name == "local" and live:
        previous.close()
        raise UsageError(
            f"another sweep is still running on {layout.root} ({len(live)} run(s) under way); "
            f"stop it with `amb sweep cancel {layout.root}` or wait for it"
        )
    out = {}
    for cell in cells:
        if cell.state == "pending" and cell.attempts and cell.attempts[-1][0] in live:
            cell.attempts.pop()
            out[cell.attempt_id(next_attempt(cell))] = cell
    if not out:
        previous.close()
        return {}, None
    return out, previous


class _InFlight:
    """The attempts a sweep has in flight: submitted to its executor, or adopted from the previous
    executor of the root (which still runs them)."""

    def __init__(
        self,
        spec: SweepSpec,
        layout: Layout,
        backend: Backend,
        progress: Progress,
        ex: Executor,
        previous: Executor | None,
        adopted: dict[str, CellState],
    ):
        self.spec, self.layout, self.backend, self.progress = spec, layout, backend, progress
        self.ex, self.previous, self.adopted = ex, previous, adopted
        self.cells: dict[str, CellState] = dict(adopted)
        """Run id -> its cell, for every attempt in flight."""
        for cell in adopted.values():
            cell.state = "running"
        self.ended_at: dict[str, float] = {}
        # An executor whose "ended" is final (a local child has exited: its shard is placed or never
        # will be) says so with lost_after_s = 0; on a shared filesystem a rename may show up later.
        self.lost_after_s = float(getattr(ex, "lost_after_s", LOST_AFTER_S))

    def submit(self, cells: list[CellState]) -> None:
        """The next attempt of each cell that needs one, its spec written and handed to the executor."""
        planned = write_specs(self.spec, cells, self.layout, self.backend)
        for rid, cell, _path in planned:
            self.cells[rid] = cell
            cell.state = "running"
        if planned:
            self.ex.submit([path for _rid, _cell, path in planned])

    def poll(self) -> dict[str, str]:
        """The engine's view of every attempt in flight: adopted ones from the previous executor (one
        it no longer lists has ended), the rest from this one."""
        states: dict[str, str] = dict(self.ex.poll())
        if self.previous is not None and self.adopted:
            before = self.previous.poll()
            for rid in self.adopted:
                states.setdefault(rid, before.get(rid, "ended"))
        return states

    def collect(self, final: bool = False) -> tuple[list[Path], list[CellState]]:
        """Shards that landed since the last call, and the cells that need another attempt."""
        from sweeps.state import shard_outcome

        layout, states = self.layout, self.poll()
        landed: list[Path] = []
        retry: list[CellState] = []
        now = time.monotonic()
        for rid, cell in list(self.cells.items()):
            outcome = shard_outcome(layout, rid)
            if outcome in (None, "unfinished"):
                if states.get(rid) != "ended":
                    continue
                first = self.ended_at.setdefault(rid, now)
                if now - first < (0.0 if final else self.lost_after_s):
                    continue
                outcome = "lost"
            else:
                landed.append(layout.shard(rid))
            del self.cells[rid]
            read_cell(layout, cell, self.spec.max_attempts)
            if outcome == "lost" and (not cell.attempts or cell.attempts[-1][0] != rid):
                cell.attempts.append((rid, "lost"))
            self.progress.line(f"{rid}: {outcome}")
            if cell.state == "pending" and not final:
                # A failure counts against max_attempts (read_cell said there are attempts left); an
                # interrupted or lost attempt does not. Either way the cell gets a new attempt.
                cell.state = "pending" if outcome in INTERRUPTED else "failed"
                retry.append(cell)
        return landed, retry

    def wind_down(self, ingest: Callable[[list[Path]], None]) -> None:
        """Cancel what is in flight and read back the shards its execs place as they stop."""
        self.progress.line(f"stopping {len(self.cells)} running cell(s)")
        self.ex.cancel()
        if self.previous is not None:
            self.previous.cancel()
        # Their execs closed the runs as killed and placed the shards: read them back.
        deadline = time.monotonic() + 10
        while self.cells and time.monotonic() < deadline:
            landed, _ = self.collect(final=True)
            if landed:
                ingest(landed)
            time.sleep(0.1)
        for cell in self.cells.values():
            read_cell(self.layout, cell, self.spec.max_attempts)

    def close(self) -> dict[str, float]:
        """Close the executors; returns when each attempt was dispatched, where the executor knows."""
        dispatch = dict(getattr(self.ex, "dispatched", {}) or {})
        self.ex.close()
        if self.previous is not None:
            self.previous.close()
        return dispatch
