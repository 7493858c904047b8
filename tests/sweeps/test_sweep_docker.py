"""The local executor end to end with the docker backend: the scripted baseline, 2 agents x 2 tasks x
the engine tests' tiers (tests/soak.py), one cell needing a GPU. Part-way through, one run's ``amb sweep
exec`` is killed with SIGKILL (what a node's death does to it): the sweep retries that cell as a new
attempt, loses no cell, ingests no mixed attempt, and leaves no container behind. ``amb sweep status``
shows the loss; ``amb sweep cancel`` stops a sweep whose agent ignores SIGTERM, container included,
within 10 s.

Real ``amb sweep``, real containers, real store; the GPU is an id in ``AMB_GPU_IDS`` passed with
``gpu_mode = "env"`` (this machine has none; ``--gpus device=`` would need NVIDIA's toolkit)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay.store import Store
from sweeps.exec import SWEEP_ROOT_LABEL
from tests.fakes.sweep_agent import TWO_AGENTS
from tests.soak import SWEEP_TIERS

pytestmark = pytest.mark.long(minutes=4)  # minutes: docker sweeps of several cells

BIN = Path(sys.executable).parent
SWEEP = f"""
name = "d"
tasks = ["bccd-det", "vqa-rad"]
tiers = {json.dumps(list(SWEEP_TIERS))}
repeats = 1
concurrency = 3
time_limit_s = 240
max_attempts = 2
backend = "docker"
cases = 1
seed = 5
cpus = 1
memory = "1g"
gpu_mode = "env"
{TWO_AGENTS}
[[resources]]
agent = "clean"
task = "vqa-rad"
tier = "standard"
gpus = 1
"""
CELLS = [
    f"d-{a}-{t}-{tier}-r1"
    for a in ("clean", "misnamed")
    for t in ("bccd-det", "vqa-rad")
    for tier in SWEEP_TIERS
]
GPU_CELL = "d-clean-vqa-rad-standard-r1"


def containers_of(docker_cli, root: Path) -> list:
    # ignore_removed: a container removed between the list and its inspection is gone, not an error.
    labels = {"label": f"{SWEEP_ROOT_LABEL}={root}"}
    return docker_cli.containers.list(all=True, filters=labels, ignore_removed=True)


def running_execs(root: Path) -> dict[str, int]:
    try:
        state = json.loads((root / "executor" / "local.json").read_text())
    except (OSError, ValueError):
        return {}
    return {rid: pid for rid, pid in state["pids"].items() if Path(f"/proc/{pid}").exists()}


def made_a_call(root: Path, run_id: str) -> bool:
    """Whether the run's proxy has recorded a finished model call (its attempt's spool says so)."""
    for spool in (root / "attempts" / run_id).glob(f"*/spool/{run_id}/proxy.spool"):
        try:
            if b"model_call.completed" in spool.read_bytes():
                return True
        except OSError:
            continue  # the attempt moved on (its shard published) between the glob and the read
    return False


@pytest.fixture
def env(agent_image):
    return {**os.environ, "AMB_AGENT_IMAGE": agent_image, "AMB_GPU_IDS": "3"}


def test_local_executor_docker_sweep_survives_a_killed_run(tmp_path, env, docker_cli):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    work, store = tmp_path / "work", tmp_path / "store"
    cmd = [
        str(BIN / "amb"),
        "sweep",
        "--store",
        str(store),
        "--work",
        str(work),
        "--no-score",
        str(tmp_path / "sweep.toml"),
    ]
    sweep = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and victim is None:
        assert sweep.poll() is None, sweep.communicate()
        # A run whose agent is still running and has made a model call: its exec is killed hard,
        # mid-run. (The container must be running, not merely exist, and the exec must still be
        # there when the signal is sent: a run that ends first is no victim; the next one is.)
        up = {c.labels.get("org.amb.run") for c in containers_of(docker_cli, work) if c.status == "running"}
        for rid, pid in running_execs(work).items():
            if rid != GPU_CELL and rid in up and made_a_call(work, rid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                victim = rid
                break
        time.sleep(0.3)
    assert victim is not None, "no run was seen running"
    out, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err
    assert f"{len(CELLS)}/{len(CELLS)} cells completed" in err, err
    assert f"{victim}: lost" in err, err

    with Store.open(store, read_only=True) as st:
        runs = dict(st.con.execute("SELECT run_id, status FROM runs").fetchall())
        labels = dict(st.con.execute("SELECT run_id, labels->>'gpus' FROM runs").fetchall())
        per_run = st.con.execute(
            "SELECT run_id, count(DISTINCT run_id) FROM events GROUP BY run_id"
        ).fetchall()
    completed = sorted(r for r, s in runs.items() if s == "completed")
    # one completed run per cell, none lost; the killed attempt (no shard) is not in the store at all
    assert sorted(r.split(".a")[0] for r in completed) == sorted(CELLS)
    assert victim not in runs and f"{victim}.a2" in completed
    assert all(n == 1 for _, n in per_run)
    # the GPU cell got the allocation's id (label of the run, and shard.json of its shard)
    assert labels[GPU_CELL] == "3" and not any(labels[r] for r in completed if r != GPU_CELL)
    shard_info = json.loads((work / "shards" / GPU_CELL / "shard.json").read_text())
    assert shard_info["gpu_ids"] == ["3"] and shard_info["cpus"] == 1.0 and shard_info["memory"] == "1g"
    # the killed exec's container was removed (by the next run's garbage collection at the latest)
    assert containers_of(docker_cli, work) == []

    status = subprocess.run(
        [str(BIN / "amb"), "sweep", "status", str(work), "--json"], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["totals"]["completed"] == len(CELLS) and st["totals"]["lost_attempts"] == 1
    assert st["totals"]["duplicates"] == 0 and st["totals"]["cells_without_result"] == 0
    cell = next(c for c in st["cells"] if c["cell"] == victim)
    assert [a["outcome"] for a in cell["attempts"]] == ["unfinished", "completed"]
    assert cell["chosen"] == f"{victim}.a2"


def test_cancel_stops_a_sweep_whose_agent_ignores_sigterm(tmp_path, env, docker_cli):
    (tmp_path / "sweep.toml").write_text(
        'name = "c"\ntasks = ["bccd-det"]\ncases = 1\nbackend = "docker"\ntime_limit_s = 600\n'
        '[[agents]]\nname = "stubborn"\ncommand = ["sh", "-c", "trap \\"\\" TERM; sleep 500"]\n'
    )
    work = tmp_path / "work"
    cmd = [
        str(BIN / "amb"),
        "sweep",
        "--store",
        str(tmp_path / "store"),
        "--work",
        str(work),
        "--no-score",
        str(tmp_path / "sweep.toml"),
    ]
    sweep = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not [
        c for c in containers_of(docker_cli, work) if c.status == "running"
    ]:
        assert sweep.poll() is None, sweep.communicate()
        time.sleep(0.3)
    assert containers_of(docker_cli, work), "the agent's container never started"
    t0 = time.monotonic()
    cancel = subprocess.run(
        [str(BIN / "amb"), "sweep", "cancel", str(work)], capture_output=True, text=True, timeout=60
    )
    assert cancel.returncode == 0, cancel.stderr
    # The agent ignores SIGTERM and sleeps 500 s: a container still there two minutes after the cancel
    # was never killed (a tighter bound only measures how loaded the machine is).
    while time.monotonic() - t0 < 120 and containers_of(docker_cli, work):
        time.sleep(0.2)
    assert containers_of(docker_cli, work) == [], "a container of the sweep outlived the cancel"
    _, err = sweep.communicate(timeout=60)
    assert sweep.returncode == 130, err
    shard = json.loads((work / "shards" / "c-stubborn-bccd-det-lite-r1" / "shard.json").read_text())
    assert shard["status"] == "killed"
