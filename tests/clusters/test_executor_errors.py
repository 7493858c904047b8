"""The SLURM and Ray executors' errors: one clear ``amb: error`` line naming the thing, never a
traceback. No cluster needed: these fail before any engine is reached."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.clusters import sweep_kit as kit


def _amb(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kit.BIN / "amb"), *args], capture_output=True, text=True, env=env, timeout=120)


def _a_sweep(root: Path, executor: str) -> None:
    """The plan a sweep's driver writes first (``amb sweep cancel`` refuses a folder without one)."""
    plan = {"name": "x", "max_attempts": 1, "agents": {}, "cells": [], "executor": executor}
    (root / "sweep.json").write_text(json.dumps(plan))


@pytest.mark.parametrize(
    ("name", "garbage"),
    [("slurm", b"{not json"), ("ray", b'{"placements": 7}'), ("slurm", b'{"batches": [{"job_id": 1}]}')],
)
def test_a_damaged_executor_state_is_named(tmp_path: Path, name: str, garbage: bytes) -> None:
    _a_sweep(tmp_path, name)
    state = tmp_path / "executor"
    state.mkdir()
    (state / "name").write_text(name + "\n")
    (state / f"{name}.json").write_bytes(garbage)
    proc = _amb("sweep", "cancel", str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr  # a usage error
    assert f"amb: error: {state / f'{name}.json'}: cannot read the" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_no_sbatch_on_path_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sweep.toml").write_text(kit.sweep_file("np"), encoding="utf-8")
    env = {**os.environ, "PATH": str(kit.BIN)}  # amb's own, and no SLURM client
    proc = subprocess.run(
        kit.sweep_argv(tmp_path / "sweep.toml", tmp_path / "store", tmp_path / "work", "slurm", "--no-score"),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr  # a usage error
    assert "amb: error: the SLURM executor needs sbatch on PATH" in proc.stderr
    assert "Traceback" not in proc.stderr


def _dashboard_answering(status: int, body: bytes):
    """A loopback HTTP server that answers every request with ``status`` and ``body``."""
    import http.server
    import threading

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def test_cancel_of_a_ray_job_the_dashboard_refuses_or_that_none_answers_is_named(tmp_path: Path) -> None:
    _a_sweep(tmp_path, "ray")
    state = tmp_path / "executor"
    state.mkdir()
    (state / "name").write_text("ray\n")
    (state / "ray.json").write_bytes(b'{"job_submission_id": "raysubmit_x/../y"}')
    server = _dashboard_answering(404, b"Job raysubmit_x/../y does not exist")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        proc = _amb("sweep", "cancel", str(tmp_path), env={**os.environ, "RAY_DASHBOARD_ADDRESS": url})
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"amb: error: Ray's dashboard at {url} did not stop job raysubmit_x/../y: "
        "HTTP 404 Job raysubmit_x/../y does not exist"
    )
    # Nothing listens on the port any more.
    proc = _amb("sweep", "cancel", str(tmp_path), env={**os.environ, "RAY_DASHBOARD_ADDRESS": url})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"amb: error: cannot reach Ray's dashboard at {url} to stop job"), (
        proc.stderr
    )


def test_ray_placements_the_tasks_wrote_fill_what_the_driver_missed(tmp_path: Path) -> None:
    """A run whose task returned while its driver was being stopped has no placement in ray.json;
    the placement its task wrote itself fills it (a failed task keeps the driver's error beside
    it); a task's file that cannot be read is passed over. No cluster needed."""
    from sweeps.ray import TASK_PLACEMENTS, RayExecutor
    from sweeps.shard import Layout

    state = tmp_path / "executor"
    (state / TASK_PLACEMENTS).mkdir(parents=True)
    (state / "name").write_text("ray\n")
    (state / "ray.json").write_text(
        '{"placements": {"a": {"node_id": "n1", "gpu_ids": [], "exit_code": 0},'
        ' "c": {"error": "TaskCancelledError: cancelled"}}}'
    )
    tasks = state / TASK_PLACEMENTS
    (tasks / "a.json").write_text('{"node_id": "n-other", "gpu_ids": []}')  # the driver's own stands
    (tasks / "b.json").write_text('{"node_id": "n2", "gpu_ids": ["0"], "exit_code": 0}')
    (tasks / "c.json").write_text('{"node_id": "n1", "gpu_ids": []}')
    (tasks / "d.json").write_text('{"node_id": ')  # a task killed mid-write leaves no sound file
    placements = RayExecutor.attach(Layout(tmp_path)).describe()["placements"]
    assert placements == {
        "a": {"node_id": "n1", "gpu_ids": [], "exit_code": 0, "error": None},
        "b": {"node_id": "n2", "gpu_ids": ["0"], "exit_code": 0, "error": None},
        "c": {"node_id": "n1", "gpu_ids": [], "exit_code": None, "error": "TaskCancelledError: cancelled"},
    }
