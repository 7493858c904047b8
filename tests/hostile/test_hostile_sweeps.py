"""A sweep's work directory is shared, and anything that can write there can write its executor's
state: ``amb sweep cancel`` signals only the processes that are this sweep's own (its driver holds
``executor/driver.lock`` open, each exec its run's log), never a pid the state file merely names."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schemas.tempdirs import process_start

BIN = Path(sys.executable).parent


def _amb(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "amb"), *args], capture_output=True, text=True, timeout=120)


def _bystander(*argv: str, holding: Path | None = None) -> subprocess.Popen[bytes]:
    """A process of this user that is no part of the sweep (its argv may look like an exec's)."""
    code = "import sys, time\nf = open(sys.argv[1]) if sys.argv[1] else None\ntime.sleep(300)"
    return subprocess.Popen([sys.executable, "-c", code, str(holding or ""), *argv], start_new_session=True)


def test_cancel_leaves_alone_the_processes_a_state_file_names_that_are_not_the_sweeps(tmp_path: Path) -> None:
    work = tmp_path / "work"
    for d in ("executor", "logs"):
        (work / d).mkdir(parents=True)
    plan = {"name": "x", "max_attempts": 1, "agents": {}, "cells": [], "executor": "local"}
    (work / "sweep.json").write_text(json.dumps(plan))
    (work / "executor" / "name").write_text("local\n")
    held = tmp_path / "elsewhere.log"
    held.write_text("")
    driver_like = _bystander(holding=held)
    exec_like = _bystander("sweep", "exec", holding=held)
    linked = _bystander("sweep", "exec", holding=held)
    bystanders = [driver_like, exec_like, linked]
    try:
        while process_start(linked.pid) is None or not any(
            os.path.realpath(f"/proc/{linked.pid}/fd/{fd}") == str(held)
            for fd in os.listdir(f"/proc/{linked.pid}/fd")
        ):
            time.sleep(0.05)
        # Files planted in the work directory that lead to the bystanders' open file.
        (work / "executor" / "driver.lock").symlink_to(held)
        (work / "logs" / "r-sym.log").symlink_to(held)
        os.link(held, work / "logs" / "r-hard.log")
        state = {
            "pids": {"r-none": exec_like.pid, "r-sym": linked.pid, "r-hard": exec_like.pid},
            "driver": driver_like.pid,
            "driver_start": int(process_start(driver_like.pid) or 0),
        }
        (work / "executor" / "local.json").write_text(json.dumps(state))

        status = _amb("sweep", "status", "--json", str(work))
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["executor"]["running"] == []
        cancel = _amb("sweep", "cancel", "--wait", "0", str(work))
        assert cancel.returncode == 0, cancel.stderr
        time.sleep(0.5)  # a SIGTERM would have ended them by now; none is sent
        assert [p.poll() for p in bystanders] == [None, None, None], cancel.stderr
    finally:
        for p in bystanders:
            p.kill()
            p.wait()


@pytest.mark.parametrize("name", ["slurm", "ray"])
def test_cancel_leaves_alone_a_driver_pid_that_is_not_the_sweeps(tmp_path: Path, name: str) -> None:
    (tmp_path / "executor").mkdir()
    plan = {"name": "x", "max_attempts": 1, "agents": {}, "cells": [], "executor": name}
    (tmp_path / "sweep.json").write_text(json.dumps(plan))
    (tmp_path / "executor" / "name").write_text(name + "\n")
    bystander = _bystander("sweep", "run")
    try:
        state = {"driver_host": socket.gethostname(), "driver_pid": bystander.pid}
        (tmp_path / "executor" / f"{name}.json").write_text(json.dumps(state))
        cancel = _amb("sweep", "cancel", "--wait", "0", str(tmp_path))
        assert cancel.returncode == 0, cancel.stderr
        time.sleep(0.5)  # a SIGTERM would have ended it by now; none is sent
        assert bystander.poll() is None, cancel.stderr
    finally:
        bystander.kill()
        bystander.wait()


def test_a_slurm_job_id_that_is_not_digits_never_reaches_scancel(tmp_path: Path) -> None:
    (tmp_path / "executor").mkdir()
    plan = {"name": "x", "max_attempts": 1, "agents": {}, "cells": [], "executor": "slurm"}
    (tmp_path / "sweep.json").write_text(json.dumps(plan))
    (tmp_path / "executor" / "name").write_text("slurm\n")
    batch = {"job_id": "--user=root", "resource_class": "cpu", "run_ids": [], "script": "x"}
    state = tmp_path / "executor" / "slurm.json"
    state.write_text(json.dumps({"batches": [batch]}))
    cancel = _amb("sweep", "cancel", "--wait", "0", str(tmp_path))
    assert cancel.returncode == 2, cancel.stderr
    assert cancel.stderr.startswith(f"amb: error: {state}: cannot read the SLURM executor's state"), (
        cancel.stderr
    )
    assert "job_id" in cancel.stderr and "Traceback" not in cancel.stderr


SWEEP = """
name = "c"
tasks = ["bccd-det"]
cases = 1
backend = "local"
time_limit_s = 600
[[agents]]
name = "slow"
command = ["sleep", "500"]
"""


def test_cancel_stops_a_local_sweeps_driver_and_its_exec(tmp_path: Path) -> None:
    """The real driver and exec hold their files open: cancel stops them (the sweep ends at once)."""
    (tmp_path / "sweep.toml").write_text(SWEEP)
    work = tmp_path / "work"
    cmd = [str(BIN / "amb"), "sweep", "--store", str(tmp_path / "store"), "--work", str(work), "--no-score"]
    sweep = subprocess.Popen(
        [*cmd, str(tmp_path / "sweep.toml")], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        running: list[str] = []
        while time.monotonic() < deadline and not running:
            assert sweep.poll() is None, sweep.communicate()
            status = _amb("sweep", "status", "--json", str(work))
            if status.returncode == 0:
                running = json.loads(status.stdout)["executor"].get("running", [])
            time.sleep(0.3)
        assert running == ["c-slow-bccd-det-lite-r1"], "the exec never showed as running"
        cancel = _amb("sweep", "cancel", "--wait", "0", str(work))
        assert cancel.returncode == 0, cancel.stderr
        _, err = sweep.communicate(timeout=90)
        assert sweep.returncode == 130, err
    finally:
        if sweep.poll() is None:
            sweep.send_signal(signal.SIGINT)
            sweep.communicate(timeout=60)
    status = _amb("sweep", "status", "--json", str(work))
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["executor"]["running"] == [] and st["totals"]["completed"] == 0


RUN = "x-a-bccd-det-lite-r1"


def _damaged_sweep(root: Path, damaged: str, kind: str) -> Path:
    """A one-cell sweep whose run has its shard, with one of its files replaced by ``kind``."""
    agent = {"name": "a", "command": ["true"], "model": "", "upstream": [], "env": {}}
    cell = {"sweep": "x", "agent": "a", "task": "bccd-det", "tier": "lite", "repeat": 1}
    plan = {"name": "x", "max_attempts": 1, "agents": {"a": agent}, "cells": [cell], "executor": "local"}
    for d in ("executor", "cells", f"shards/{RUN}"):
        (root / d).mkdir(parents=True)
    (root / "sweep.json").write_text(json.dumps(plan))
    (root / "executor" / "name").write_text("local\n")
    (root / "executor" / "local.json").write_text("{}")
    (root / "cells" / RUN).write_text(RUN + "\n")
    (root / "shards" / RUN / "shard.json").write_text("{}")
    path = root / damaged
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "endless":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(300 << 20)  # sparse: larger than any state file amb writes
    return path


@pytest.mark.parametrize("kind", ["fifo", "endless", "huge"])
@pytest.mark.parametrize(
    ("damaged", "said"),
    [
        (f"shards/{RUN}/shard.json", None),
        ("executor/local.json", None),
        ("executor/name", None),
        (f"cells/{RUN}", "cannot read the cell's claim"),
        ("sweep.json", "unreadable"),
    ],
)
def test_status_of_a_sweep_whose_files_are_fifos_devices_or_huge(
    tmp_path: Path, damaged: str, said: str | None, kind: str
) -> None:
    """Never a read that blocks or never ends: a damaged shard is a corrupt attempt, a damaged
    executor state is none, and a damaged plan or claim is one error line naming the file."""
    path = _damaged_sweep(tmp_path, damaged, kind)
    status = _amb("sweep", "status", "--json", str(tmp_path))
    assert "Traceback" not in status.stderr
    if said is None:
        assert status.returncode == 0, status.stderr
        st = json.loads(status.stdout)
        if damaged.startswith("shards/"):
            assert st["cells"][0]["attempts"] == [{"run_id": RUN, "outcome": "corrupt"}]
        if damaged == "executor/name":
            said = f"{path}: cannot read which executor runs the sweep: "
            assert st["executor"]["error"].startswith(said), st["executor"]
            cancel = _amb("sweep", "cancel", "--wait", "0", str(tmp_path))
            assert cancel.returncode == 2 and cancel.stderr.startswith(f"amb: error: {said}"), cancel.stderr
    else:
        assert status.returncode == 2, status.stderr
        assert status.stderr.startswith(f"amb: error: {path}: {said}"), status.stderr
        assert len(status.stderr.splitlines()) == 1


@pytest.mark.parametrize("task", ["../../../outside/x", "new\nline", "long" * 40])
def test_status_refuses_a_plan_whose_cell_is_no_plain_name(tmp_path: Path, task: str) -> None:
    """A cell's key names its files under shards/, cells/ and attempts/: one that would lead out of
    the work directory (or is no run id at all) is one error line naming the plan."""
    work = tmp_path / "work"
    _damaged_sweep(work, "executor/local.json", "huge")
    plan = json.loads((work / "sweep.json").read_text())
    plan["cells"][0]["task"] = task
    (work / "sweep.json").write_text(json.dumps(plan))
    key = f"x-a-{task}-lite-r1"
    (work / "cells" / "x-a-..").mkdir()  # so that the key resolves, out of the work directory
    (work / "shards" / "x-a-..").mkdir()
    status = _amb("sweep", "status", "--json", str(work))
    assert status.returncode == 2, status.stdout
    said = f"amb: error: {work / 'sweep.json'}: cell {key!r} is not a run id"
    assert status.stderr.startswith(said), status.stderr
    assert len(status.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_an_executor_name_that_is_not_text_is_named_not_a_traceback(tmp_path: Path) -> None:
    path = _damaged_sweep(tmp_path, "executor/name", "huge")
    path.unlink()
    path.write_bytes(b"\xff\xfe")
    said = f"{path}: cannot read which executor runs the sweep: not UTF-8 text"
    status = _amb("sweep", "status", "--json", str(tmp_path))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["executor"]["error"] == said
    cancel = _amb("sweep", "cancel", "--wait", "0", str(tmp_path))
    assert cancel.returncode == 2 and cancel.stderr == f"amb: error: {said}\n", cancel.stderr
