"""``amb sweep exec SPEC.json``: execute one run spec and record one run into a shard.

The one command every executor runs; docs/scale-out.md (The command) has each step and its exit
statuses: 0 when a shard was placed, 3 when the attempt was already complete, 2 when it could not run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import msgspec

from recorder.run import RunSpec as RecordSpec
from recorder.run import Stopped, parse_upstreams, record
from schemas.codec import decode_event
from schemas.durable import write_durably
from schemas.errors import SpoolError
from schemas.events import RunFinished
from schemas.frames import scan
from schemas.tempdirs import make_tempdir, remove_tempdir
from sweeps.shard import EXEC_FILE, Layout, ShardInfo, file_sizes, new_token, place
from sweeps.spec import RunSpec, SpecError, load
from sweeps.standin import STOP_SIGNALS

STOP_GRACE_S = 5.0
"""Between forwarding a stop signal to the agent's container and killing it."""

ALREADY_COMPLETE = 3
"""Exit status of ``amb sweep exec`` when the attempt already has its shard (nothing was run)."""

SWEEP_ROOT_LABEL = "org.amb.sweep_root"
"""Container label: the shard root of the sweep the container belongs to (``amb sweep cancel``)."""

PLACEHOLDERS = ("model", "workspace", "data", "task", "tier", "repeat", "run_id")


class _Stopped(Stopped):
    """A stop signal arrived while no container was running (before or after the run): the recorder
    closes a run it had started as ``killed``."""


@dataclass(frozen=True)
class Allocation:
    """What this execution may use, from the engine's allocation (else the spec's limits)."""

    cpus: float | None
    memory: str | None
    gpu_ids: list[str]


def allocation(spec: RunSpec, env: Mapping[str, str]) -> Allocation:
    """CPU, memory and GPU ids for ``docker run``, each from the first variable set (the order is in
    docs/scale-out.md, The command), else the spec."""
    cpus = spec.limits.cpus
    for var in ("AMB_CPUS", "SLURM_CPUS_PER_TASK"):
        if env.get(var):
            try:
                cpus = float(env[var])
            except ValueError:
                raise SpecError(f"{var}={env[var]!r} is not a number of CPUs") from None
            break
    memory = spec.limits.memory
    if env.get("AMB_MEMORY"):
        memory = env["AMB_MEMORY"]
    elif env.get("SLURM_MEM_PER_NODE", "").isdigit():
        memory = f"{env['SLURM_MEM_PER_NODE']}m"
    gpu_ids: list[str] = []
    if spec.limits.gpus:
        source, ids = "", []
        for var in ("AMB_GPU_IDS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
            if env.get(var):
                source, ids = var, [x.strip() for x in env[var].split(",") if x.strip()]
                break
        if len(ids) < spec.limits.gpus and spec.backend == "docker":
            got = (
                f"{source}={env[source]!r}"
                if source
                else "no AMB_GPU_IDS, SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES"
            )
            raise SpecError(f"run {spec.run_id} needs {spec.limits.gpus} GPU(s); the allocation has {got}")
        # Locally (a Kubernetes pod, a bare node) the devices are already the process's own: the ids,
        # when known, are only recorded.
        gpu_ids = ids[: spec.limits.gpus]
    return Allocation(cpus, memory, gpu_ids)


def agent_argv(spec: RunSpec, values: dict[str, str]) -> list[str]:
    """The agent's command with its placeholders filled; ``amb-agent`` resolved for the backend."""
    cmd = [c.format_map(_Missing(values)) for c in spec.agent.command]
    if cmd[0] == "amb-agent":
        if spec.backend == "docker":
            # The agent image does not carry amb: its single source file goes to python3 -c.
            from agents import amb_agent

            cmd = ["python3", "-c", Path(amb_agent.__file__).read_text(encoding="utf-8"), *cmd[1:]]
        else:
            exe = Path(sys.executable).with_name("amb-agent")
            cmd = [str(exe) if exe.exists() else (shutil.which("amb-agent") or "amb-agent"), *cmd[1:]]
    return cmd


class _Missing(dict[str, str]):
    def __missing__(self, key: str) -> str:
        raise SpecError(
            f"unknown placeholder {{{key}}} in an agent command (known: {', '.join(PLACEHOLDERS)})"
        )


def run_status(store_dir: Path, run_id: str) -> str | None:
    """How a run ended, from its own recorder spool: the ``run.finished`` status, ``unfinished``
    when it started but never finished, None when it never started."""
    path = store_dir / "spool" / run_id / "recorder.spool"
    if not path.exists():
        return None
    try:
        bodies = scan(path.read_bytes(), str(path)).bodies
    except (OSError, SpoolError):
        return "unfinished"
    for body in reversed(bodies):
        try:
            event = decode_event(body)
        except Exception:  # a body this amb cannot decode is not a run.finished
            continue
        if isinstance(event.payload, RunFinished):
            return event.payload.status
    return "unfinished" if bodies else None


class _StopsItsContainer:
    """The backend, except that a stop signal forwarded to the agent also arms a kill after
    ``STOP_GRACE_S`` (an agent that ignores SIGTERM cannot keep its container running), and that
    with ``gpu_mode = "env"`` the container gets ``NVIDIA_VISIBLE_DEVICES``."""

    def __init__(self, backend: Any, gpu_env: str | None = None):
        self._backend = backend
        self._gpu_env = gpu_env
        self._timers: list[threading.Timer] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def start(self, argv: list[str], env: dict[str, str]) -> Any:
        if self._gpu_env:
            env = {**env, "NVIDIA_VISIBLE_DEVICES": self._gpu_env}
        return self._backend.start(argv, env)

    def send_signal(self, handle: object, sig: int) -> None:
        self._backend.send_signal(handle, sig)
        timer = threading.Timer(STOP_GRACE_S, self._backend.kill, (handle,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def close(self, handle: object) -> None:
        for t in self._timers:
            t.cancel()
        self._backend.close(handle)


def _backend(spec: RunSpec, alloc: Allocation) -> _StopsItsContainer:
    if spec.backend == "local":
        from recorder.local_backend import LocalBackend

        return _StopsItsContainer(LocalBackend(shim=True))
    from recorder.docker_backend import ContainerResources, DockerBackend

    defaults = ContainerResources()
    resources = ContainerResources(cpus=alloc.cpus or defaults.cpus, memory=alloc.memory or defaults.memory)
    ids = ",".join(alloc.gpu_ids)
    gpus = f"device={ids}" if ids and spec.gpu_mode == "nvidia" else None
    labels = {SWEEP_ROOT_LABEL: spec.shard_root, "org.amb.sweep": spec.cell.sweep}
    if ids:
        labels["org.amb.gpus"] = ids
    backend = DockerBackend(resources=resources, gpus=gpus, labels=labels)
    return _StopsItsContainer(backend, ids if spec.gpu_mode == "env" else None)


class _Ended(NamedTuple):
    """How the recording of the run ended, for its ``shard.json``."""

    status: str
    exit_code: int
    reason: str | None
    run_s: float | None
    """The recorder's own time (None when the run was stopped outside it)."""


class _Attempt(NamedTuple):
    """One execution's own directory, ``attempts/<run id>/<token>/``, and who made it."""

    dir: Path
    token: str
    host: str
    started_ns: int

    @classmethod
    def begin(cls, layout: Layout, run_id: str) -> _Attempt:
        layout.make()
        token = new_token()
        attempt_dir = layout.attempts / run_id / token
        attempt_dir.mkdir(parents=True)
        started_ns = time.time_ns()
        host = token.rsplit("-", 2)[0]
        who = {"host": host, "pid": os.getpid(), "token": token, "started_ns": started_ns}
        write_durably(attempt_dir / EXEC_FILE, msgspec.json.encode(who))
        return cls(attempt_dir, token, host, started_ns)


def _shard_info(
    spec: RunSpec, alloc: Allocation, attempt: _Attempt, ended: _Ended, ended_ns: int
) -> ShardInfo:
    run_id, (attempt_dir, token, host, started_ns) = spec.run_id, attempt
    status, exit_code, reason, run_s = ended
    return ShardInfo(
        run_id=run_id,
        cell=spec.cell.key,
        attempt=spec.attempt,
        status=status,
        exit_code=exit_code,
        host=host,
        pid=os.getpid(),
        token=token,
        started_ns=started_ns,
        ended_ns=ended_ns,
        run_s=run_s if run_s is not None else (ended_ns - started_ns) / 1e9,
        gpu_ids=alloc.gpu_ids,
        cpus=alloc.cpus,
        memory=alloc.memory,
        files=file_sizes(attempt_dir),
        reason=reason,
    )


def _placeholders(spec: RunSpec, workspace: Path) -> dict[str, str]:
    """The agent command's placeholder values, with the workspace and data where the agent sees them."""
    if spec.backend == "local":
        from tasks.registry import brief

        # The docker backend places the brief itself; locally the workspace is the cwd.
        (workspace / "tier_prompt.txt").write_text(brief(spec.cell.task, spec.cell.tier), encoding="utf-8")
        seen_ws, seen_data = str(workspace), str(Path(spec.data) / "public")
    else:
        seen_ws, seen_data = "/workspace", "/data/public"
    return {
        "model": spec.agent.model,
        "workspace": seen_ws,
        "data": seen_data,
        "task": spec.cell.task,
        "tier": spec.cell.tier,
        "repeat": str(spec.cell.repeat),
        "run_id": spec.run_id,
    }


def _labels(spec: RunSpec, alloc: Allocation) -> dict[str, str]:
    return {
        "sweep": spec.cell.sweep,
        "agent": spec.agent.name,
        "repeat": str(spec.cell.repeat),
        "attempt": str(spec.attempt),
        # Where it ran, in the run's own record (the store keeps the run, not its shard, whose host
        # is a name made safe for a file name).
        "host": socket.gethostname(),
        **({"model": spec.agent.model} if spec.agent.model else {}),
        **({"gpus": ",".join(alloc.gpu_ids)} if alloc.gpu_ids else {}),
        **spec.labels,
    }


def _record(
    spec: RunSpec, alloc: Allocation, attempt_dir: Path, workspace: Path, baseline_url: str
) -> _Ended:
    upstreams = [u.replace("{baseline}", baseline_url) for u in spec.agent.upstream]
    argv, labels = agent_argv(spec, _placeholders(spec, workspace)), _labels(spec, alloc)
    backend = _backend(spec, alloc)
    recording = time.monotonic()
    outcome = record(
        RecordSpec(
            argv=argv,
            store=attempt_dir,
            run_id=spec.run_id,
            task=spec.cell.task,
            tier=spec.cell.tier,
            data_dir=Path(spec.data),
            time_limit_s=spec.limits.time_limit_s,
            labels=labels,
            agent=spec.agent.name,
            model=spec.agent.model or None,
            upstreams=parse_upstreams(upstreams),
            workspace=workspace,
            env={**os.environ, **spec.agent.env},
            budget=spec.limits.budget,
        ),
        backend,
    )
    return _Ended(outcome.status, outcome.exit_code, outcome.reason, time.monotonic() - recording)


def execute(spec_path: Path, *, out: TextIO | None = None) -> int:
    """Execute one spec; returns the exit status (see the module's docstring)."""
    out = out or sys.stderr
    spec = load(spec_path)
    layout = Layout(Path(spec.shard_root))
    run_id = spec.run_id
    if layout.shard(run_id).exists():
        print(f"amb sweep exec: {run_id} already has its shard; nothing to do", file=out, flush=True)
        return ALREADY_COMPLETE
    alloc = allocation(spec, os.environ)
    attempt = _Attempt.begin(layout, run_id)

    def stop(signum: int, _frame: object) -> None:
        raise _Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    # Named in this process's lock file: if the exec is killed, its recorder's watchdog or `amb gc`
    # removes it (a `finally` is not reached by SIGKILL).
    workspace = make_tempdir(f"amb-ws-{run_id}-")
    server = None
    try:
        try:
            if any("{baseline}" in u for u in spec.agent.upstream):
                from agents.baseline.server import BaselineServer

                server = BaselineServer().start()
            ended = _record(spec, alloc, attempt.dir, workspace, server.url if server else "")
        except _Stopped as e:
            # Stopped outside the agent's lifetime: the recorder closed the run if it had started.
            recorded = run_status(attempt.dir, run_id)
            if recorded is None:
                shutil.rmtree(attempt.dir, ignore_errors=True)
                print(f"amb sweep exec: {run_id}: stopped by {e} before the run started", file=out)
                return 128 + signal.SIGTERM
            ended = _Ended(recorded, 128 + signal.SIGTERM, f"stopped by {e}", None)
        ended_ns = time.time_ns()
        # From here on a stop signal must not leave a half-placed shard behind.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        where, first = place(layout, attempt.dir, _shard_info(spec, alloc, attempt, ended, ended_ns))
        with contextlib.suppress(OSError):
            (layout.attempts / run_id).rmdir()  # only when no other execution of it is under way
        note = "" if first else " (a duplicate: another execution of this attempt finished first)"
        print(f"amb sweep exec: {run_id}: {ended.status}; shard {where}{note}", file=out, flush=True)
        return 0
    finally:
        if server is not None:
            server.stop()
        remove_tempdir(workspace)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
