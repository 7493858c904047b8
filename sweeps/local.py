"""The local executor: ``amb sweep exec`` as child processes of the sweep, ``concurrency`` at a time.

The execs are forked by one warm ``amb sweep exec --serve`` (``sweeps.forkserver``); should that
server fail, each spec gets a cold ``amb sweep exec SPEC.json`` instead. Each child runs in its own
session (a terminal's Ctrl-C reaches the sweep, which stops the children in order) with SIGTERM as
its parent-death signal, so a sweep killed hard never leaves a run for a resumed sweep to race.
The children's pids are saved under ``<root>/executor/local.json`` for ``amb sweep cancel DIR``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Any

import msgspec

from sweeps.executor import (
    Attached,
    ExecutorConfig,
    JobState,
    QueuedExecutor,
    exec_command,
    holds_open,
    is_driver,
    load_state,
    save_name,
    save_state,
)
from sweeps.forkserver import ExecServer, Forked
from sweeps.shard import Layout
from sweeps.standin import term_with_parent


class _State(msgspec.Struct):
    pids: dict[str, int] = msgspec.field(default_factory=dict)
    """Run id -> pid of its ``amb sweep exec`` child, while it runs."""
    driver: int | None = None
    """The driver's pid; cancel signals it only while it holds the root's driver mark open."""


class LocalExecutor(QueuedExecutor):
    name = "local"
    lost_after_s = 0.0
    """A child that exited has placed its shard or never will: the driver need not wait for one."""

    def __init__(self, config: ExecutorConfig, layout: Layout, *, concurrency: int = 1):
        super().__init__()
        self.layout = layout
        self.concurrency = max(1, config.local.concurrency or concurrency)
        self.running: dict[str, tuple[subprocess.Popen[bytes] | Forked, IO[bytes]]] = {}
        self.server: ExecServer | None = ExecServer(layout.logs / "exec-server.log")
        self.server_start_s: float | None = None
        """How long the warm exec took to be ready (once per sweep; None: not used)."""
        save_name(layout, self.name)
        self._state = _State(driver=os.getpid())
        self._save()

    @classmethod
    def attach(cls, layout: Layout) -> _Attached:
        return _Attached(layout)

    def poll(self) -> dict[str, JobState]:
        for run_id, (proc, log) in list(self.running.items()):
            if proc.poll() is not None:
                log.close()
                del self.running[run_id]
                self._state.pids.pop(run_id, None)
                self.states[run_id] = "ended"
        self._start_queued()
        return dict(self.states)

    def cancel(self) -> None:
        self._drop_queued()
        for proc, _log in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # the exec stops its container and closes the run
        deadline = time.monotonic() + 30
        for run_id, (proc, log) in list(self.running.items()):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
            log.close()
            self.states[run_id] = "ended"
            self._state.pids.pop(run_id, None)
        self.running.clear()
        self._save()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self._state.driver = None
        self._save()

    def describe(self) -> dict[str, Any]:
        return {
            "executor": self.name,
            "concurrency": self.concurrency,
            "queued": len(self.queue),
            "running": sorted(self.running),
        }

    def _start_queued(self) -> None:
        changed = False
        while self.queue and len(self.running) < self.concurrency:
            spec = self.queue.pop(0)
            run_id = spec.stem
            log_path = self.layout.logs / f"{run_id}.log"
            proc: subprocess.Popen[bytes] | Forked | None = self._fork(spec, log_path)
            if proc is not None:
                log: IO[bytes] = open(os.devnull, "ab")
            else:
                log = open(log_path, "ab")
                self.dispatched[run_id] = time.time()
                proc = subprocess.Popen(
                    exec_command(spec),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=term_with_parent,
                )
            self.running[run_id] = (proc, log)
            self.states[run_id] = "running"
            self._state.pids[run_id] = proc.pid
            changed = True
        if changed:
            self._save()

    def _fork(self, spec: Path, log_path: Path) -> Forked | None:
        """The exec of ``spec``, forked by the warm server (None: no server; start a cold one)."""
        server = self.server
        if server is None:
            return None
        if self.server_start_s is None:
            self.server_start_s = server.wait_ready()
        if self.server_start_s is not None:
            self.dispatched[spec.stem] = time.time()
            if (pid := server.start(spec, log_path)) is not None:
                return Forked(server, pid)
        self._drop_server()
        return None

    def _drop_server(self) -> None:
        """The warm exec failed (its log says why): the remaining specs start cold."""
        if self.server is not None:
            self.server.close()
            self.server = None

    def _save(self) -> None:
        save_state(self.layout, self.name, self._state)


class _Attached(Attached):
    """A local sweep seen from another process: it can stop the driver and the execs it started."""

    name = title = "local"

    def __init__(self, layout: Layout):
        super().__init__(layout)
        self.state = load_state(layout, self.name, _State)

    def poll(self) -> dict[str, JobState]:
        return {r: "running" for r, pid in self.state.pids.items() if _is_exec(self.layout, r, pid)}

    def cancel(self) -> None:
        # The driver first, so that it does not start new runs; then every exec it started.
        driver = self.state.driver
        pids = ([driver] if driver is not None and is_driver(self.layout, driver) else []) + [
            pid for r, pid in self.state.pids.items() if _is_exec(self.layout, r, pid)
        ]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "driver": self.state.driver, "running": sorted(self.poll())}


def _is_exec(layout: Layout, run_id: str, pid: int) -> bool:
    """Whether ``pid`` is this root's running exec of ``run_id``: every exec, cold or forked, has its
    run's log under the root open (not a pid recycled for something else, nor one written into
    ``local.json`` by someone else)."""
    return "/" not in run_id and holds_open(pid, layout.logs / f"{run_id}.log")
