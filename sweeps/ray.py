"""The Ray executor: one Ray task per run spec, each running ``amb sweep exec SPEC.json`` on its node.

Ray decides only where: a node with a free ``docker`` slot (a custom resource each node advertises)
and, for a run that needs GPUs, ``num_gpus``; the GPU ids Ray assigns reach the exec as
``AMB_GPU_IDS``. Cancel, a dead node and a stopped Ray Job are in docs/scale-out.md (On a Ray
cluster). Ray is an optional extra, imported when used.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from schemas.durable import read_small, write_durably
from schemas.errors import UsageError
from sweeps import standin
from sweeps.executor import (
    Attached,
    ExecutorConfig,
    JobState,
    QueuedExecutor,
    exec_command,
    load_state,
    save_name,
    save_state,
    stop_driver,
)
from sweeps.shard import Layout
from sweeps.spec import load

TASK_RETRIES = 2
"""Re-executions Ray makes of a task whose node or worker died (each is the same attempt)."""

CLOSE_WAIT_S = 30.0
"""How long a closing executor waits for tasks whose shard has landed to return their placement."""


class RayExecutorError(UsageError):
    pass


class Placement(msgspec.Struct):
    """Where one spec ran, as the task saw it."""

    node_id: str = ""
    gpu_ids: list[str] = msgspec.field(default_factory=list)
    exit_code: int | None = None
    error: str | None = None


class _State(msgspec.Struct):
    address: str = ""
    driver_host: str = ""
    driver_pid: int | None = None
    job_submission_id: str | None = None
    """Set when the driver runs as a Ray Job: ``amb sweep cancel`` stops that job."""
    placements: dict[str, Placement] = msgspec.field(default_factory=dict)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayExecutorError(
            "the Ray executor needs Ray: pip install 'amb-recorder[ray]' (on the driver and every node)"
        ) from None
    return ray


TASK_PLACEMENTS = "ray-tasks"
"""Beside ``ray.json``: one file per run, the placement its task wrote itself (``execute_on_node``)."""


def execute_on_node(spec_file: str) -> dict[str, Any]:
    """The body of every Ray task: run the exec for one spec on this node, with this task's GPUs.

    The task writes its placement into the shard root itself, before the exec and again with its
    exit code: the task's return never reaches a driver stopped meanwhile."""
    ray = _ray()
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    node_id = ray.get_runtime_context().get_node_id()
    spec = load(Path(spec_file))
    placements = Path(spec.shard_root) / "executor" / TASK_PLACEMENTS
    placements.mkdir(parents=True, exist_ok=True)
    mine = placements / f"{spec.run_id}.json"
    write_durably(mine, msgspec.json.encode(Placement(node_id=node_id, gpu_ids=gpu_ids)))
    env = dict(os.environ)
    if gpu_ids:
        env["AMB_GPU_IDS"] = ",".join(gpu_ids)
    # Behind a stand-in: when this worker exits (its owner, the driver, died), Ray SIGKILLs its
    # direct children; the exec, a grandchild, then gets SIGTERM instead (sweeps/standin.py).
    proc = subprocess.Popen(
        standin.command(exec_command(Path(spec_file))),
        env=env,
        stdin=subprocess.DEVNULL,
        preexec_fn=standin.term_with_parent,
    )
    try:
        code = proc.wait()
    except BaseException:
        # ray.cancel raises KeyboardInterrupt here: the stand-in forwards SIGTERM to the exec, which
        # stops its container and closes the run.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    write_durably(mine, msgspec.json.encode(Placement(node_id=node_id, gpu_ids=gpu_ids, exit_code=code)))
    return {"node_id": node_id, "gpu_ids": gpu_ids, "exit_code": code}


def job_submission_id(env: dict[str, str] | os._Environ[str]) -> str | None:
    """The submission id of the Ray Job this process is the driver of (None: not a Ray Job). Ray's job
    supervisor hands its driver the job's config, metadata included, in this variable."""
    try:
        config = json.loads(env.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
        value = config.get("metadata", {}).get("job_submission_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


class RayExecutor(QueuedExecutor):
    name = "ray"

    def __init__(self, config: ExecutorConfig, layout: Layout, *, concurrency: int = 1):
        super().__init__()
        self.ray = _ray()
        self.layout = layout
        self.options = config.ray
        self.window = max(1, self.options.max_in_flight or concurrency)
        address = self.options.address or os.environ.get("RAY_ADDRESS") or "auto"
        if not self.ray.is_initialized():
            try:
                self.ray.init(address=address, logging_level="WARNING", log_to_driver=False)
            except Exception as e:  # noqa: BLE001 - Ray's connection errors have no common base
                raise RayExecutorError(f"cannot connect to the Ray cluster at {address}: {e}") from None
        self._remote = self.ray.remote(execute_on_node)
        save_name(layout, self.name)
        self._state = load_state(layout, "ray", _State, RayExecutorError, "Ray")
        self._state.address = address
        self._state.driver_host = socket.gethostname()
        self._state.driver_pid = os.getpid()
        self._state.job_submission_id = job_submission_id(os.environ)
        self.in_flight: dict[Any, str] = {}
        """ObjectRef -> run id, for tasks submitted and not yet ended."""
        self._save()

    @classmethod
    def attach(cls, layout: Layout) -> _Attached:
        return _Attached(layout)

    def poll(self) -> dict[str, JobState]:
        self._record_ended(timeout=0)
        self._start_queued()
        return dict(self.states)

    def _record_ended(self, timeout: float) -> None:
        """The placement of every task that has returned (waiting up to ``timeout`` for all)."""
        if not self.in_flight:
            return
        ready, _ = self.ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=timeout)
        for ref in ready:
            run_id = self.in_flight.pop(ref)
            self.states[run_id] = "ended"
            try:
                self._state.placements[run_id] = Placement(**self.ray.get(ref))
            except Exception as e:  # noqa: BLE001 - any task failure ends it; the shard root says how
                self._state.placements[run_id] = Placement(error=f"{type(e).__name__}: {e}"[:500])
        if ready:
            self._save()

    def cancel(self) -> None:
        self._drop_queued()
        for ref in self.in_flight:
            self.ray.cancel(ref, force=False)  # KeyboardInterrupt in the task: SIGTERM to its exec
        deadline = time.monotonic() + 30
        refs = list(self.in_flight)
        while refs and time.monotonic() < deadline:
            ready, refs = self.ray.wait(refs, num_returns=len(refs), timeout=1)
        for ref in refs:
            self.ray.cancel(ref, force=True)  # the worker dies; its exec gets SIGTERM (parent death)
        for run_id in self.in_flight.values():
            self.states[run_id] = "ended"
        self.in_flight.clear()
        self._save()

    def close(self) -> None:
        # The sweep ends once every shard has landed, which is before the last tasks' returns reach
        # this process (the exec renames its shard, then exits): wait for those, so that every run's
        # placement is recorded. A cancel has emptied ``in_flight`` already.
        self._record_ended(timeout=CLOSE_WAIT_S)
        self._state.driver_pid = None
        self._save()

    def describe(self) -> dict[str, Any]:
        return {
            "executor": self.name,
            "address": self._state.address,
            "max_in_flight": self.window,
            "queued": len(self.queue),
            "in_flight": sorted(self.in_flight.values()),
        }

    def _start_queued(self) -> None:
        while self.queue and len(self.in_flight) < self.window:
            path = self.queue.pop(0)
            spec = load(path)
            ref = self._remote.options(
                num_cpus=0,
                num_gpus=spec.limits.gpus,
                resources={"docker": self.options.docker_slots},
                max_retries=TASK_RETRIES,
                retry_exceptions=False,
                name=f"amb-sweep-exec:{spec.run_id}",
            ).remote(str(path.resolve()))
            self.in_flight[ref] = spec.run_id
            self.states[spec.run_id] = "running"
            self.dispatched[spec.run_id] = time.time()

    def _save(self) -> None:
        _merge_task_placements(self._state, self.layout)
        save_state(self.layout, self.name, self._state)


class _Attached(Attached):
    """A Ray sweep seen from another process: ``amb sweep cancel`` stops its driver (the Ray Job, or
    the driver process on this machine), whose own cancel then interrupts every task."""

    name, title = "ray", "Ray"

    def __init__(self, layout: Layout):
        super().__init__(layout)
        self._state = load_state(layout, "ray", _State, RayExecutorError, "Ray")
        _merge_task_placements(self._state, layout)

    def cancel(self) -> None:
        s = self._state
        if s.job_submission_id:
            dashboard = os.environ.get("RAY_DASHBOARD_ADDRESS") or "http://127.0.0.1:8265"
            stop_job(dashboard, s.job_submission_id)
        else:
            stop_driver(self.layout, s.driver_pid, s.driver_host)

    def describe(self) -> dict[str, Any]:
        s = self._state
        return {
            "executor": self.name,
            "address": s.address,
            "driver": s.driver_pid,
            "job": s.job_submission_id,
            "placements": {r: msgspec.to_builtins(p) for r, p in sorted(s.placements.items())},
        }


def stop_job(dashboard: str, job_id: str) -> None:
    """Stop a Ray Job through the dashboard's Jobs REST API (the request Ray's JobSubmissionClient
    makes), without importing Ray: that import alone takes 3-4 s here, and `amb sweep cancel`
    promises every container stopped within 10 s."""
    url = f"{dashboard.rstrip('/')}/api/jobs/{urllib.parse.quote(job_id, safe='')}/stop"
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read(1 << 16)  # {"stopped": bool}; a job already ended is not an error
    except urllib.error.HTTPError as e:
        detail = " ".join(e.read(500).decode("utf-8", "replace").split())  # one line
        raise RayExecutorError(
            f"Ray's dashboard at {dashboard} did not stop job {job_id}: HTTP {e.code} {detail}"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise RayExecutorError(
            f"cannot reach Ray's dashboard at {dashboard} to stop job {job_id}: {reason}"
        ) from None


def _merge_task_placements(state: _State, layout: Layout) -> None:
    """The placements the tasks wrote themselves, for the runs whose return the driver never got
    (a task's own file is skipped if it cannot be read: a task killed mid-write leaves none)."""
    for path in sorted((layout.root / "executor" / TASK_PLACEMENTS).glob("*.json")):
        known = state.placements.get(path.stem)
        if known is not None and known.node_id:
            continue
        try:
            own = msgspec.json.decode(read_small(path), type=Placement)
        except (OSError, msgspec.DecodeError):
            continue
        # A task that failed (cancelled, its worker dead) keeps the driver's words for why.
        state.placements[path.stem] = Placement(
            node_id=own.node_id,
            gpu_ids=own.gpu_ids,
            exit_code=own.exit_code,
            error=known.error if known is not None else None,
        )
