"""The SLURM executor on a real SLURM cluster (controller + n1 with a fake GPU + n2, tests/clusters/).

The sweep of the scripted baseline (tests/clusters/sweep_kit.py: 2 agents x 2 tasks x its tiers, one
cell needing a GPU, docker backend) runs on the cluster; part-way, compute node n2 dies (``kill -9`` of
its slurmd and of every job it ran); the sweep is interrupted, n2 comes back, and the same command
resumes it. The store must equal the local executor's cell for cell (scores, event counts per kind),
with no cell lost, no mixed attempt, no container left running; the GPU cell ran on n1 and its container
got GPU id 0. ``amb sweep cancel`` stops every container of a running sweep within 10 s. A job killed
outright (SIGKILL to its batch script: ``scancel --batch --signal=KILL``) is cleaned up after by the
cluster's job epilog, ``amb gc``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.clusters import sweep_kit as kit
from tests.clusters.slurm_cluster import GPU_NODE, SlurmCluster

pytestmark = pytest.mark.long(minutes=6)  # minutes: a real SLURM cluster and two docker sweeps on it


def _jobcomp(cluster: SlurmCluster) -> list[dict[str, str]]:
    if not cluster.jobcomp.exists():
        return []
    return [
        dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        for line in cluster.jobcomp.read_text().splitlines()
    ]


def _env(cluster: SlurmCluster) -> dict[str, str]:
    return {**os.environ, **cluster.env}


def test_a_slurm_sweep_survives_a_dead_node_and_equals_the_local_sweep(
    tmp_path, slurm_cluster, local_reference, docker_cli
):
    name = "lr"  # the local reference's name: the same cells, the same run ids
    store, work, argv = kit.prepare(tmp_path, name, "slurm")
    watch = kit.ContainerWatch(docker_cli, work)
    try:
        first = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(slurm_cluster)
        )
        # n2 dies while one of its runs has its container up.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            on_n2 = slurm_cluster.run(["squeue", "-h", "-t", "R", "-w", "n2", "-o", "%i"], check=False).stdout
            if on_n2.strip() and kit.running_containers(docker_cli, work):
                break
            assert first.poll() is None, first.communicate()
            time.sleep(0.3)
        slurm_cluster.kill_node("n2")
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=120)
        assert first.returncode == 130, err[-3000:]
        slurm_cluster.restart_node("n2")
        slurm_cluster.wait_idle(("n1", "n2"), timeout=60)
        lists_before = set((work / "executor" / "slurm").glob("*.list"))
        done_before = {p.name for p in (work / "cells").iterdir()}
        assert len(done_before) < len(kit.cells(name))  # interrupted before the end

        second = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=_env(slurm_cluster))
    finally:
        watch.stop()
    assert second.returncode == 0, second.stderr[-3000:]
    n = len(kit.cells(name))
    assert f"{n}/{n} cells completed" in second.stderr
    kit.assert_equals_local(store, work, name, local_reference, docker_cli)

    # SLURM ran them as arrays, one per resource class; the resume submitted only what was missing.
    scripts = sorted((work / "executor" / "slurm").glob("*.sbatch"))
    gpu_scripts = [p.read_text() for p in scripts if p.name.endswith("-gpu1.sbatch")]
    assert gpu_scripts and all("#SBATCH --gres=gpu:1" in s for s in gpu_scripts)
    assert all("#SBATCH --signal=B:TERM@60" in p.read_text() for p in scripts)
    # The resume submitted only the cells that had no result yet, each attempt once.
    resumed = [
        line.rsplit("/", 1)[1].split(".")[0]
        for p in set((work / "executor" / "slurm").glob("*.list")) - lists_before
        for line in p.read_text().splitlines()
    ]
    assert resumed and not set(resumed) & done_before, (resumed, done_before)
    submitted = [
        line for p in (work / "executor" / "slurm").glob("*.list") for line in p.read_text().splitlines()
    ]
    assert len(submitted) == len(set(submitted)) == len(list((work / "specs").glob("*.json")))
    # the GPU cell's run went to the GPU node, and its container was given that node's GPU id
    gpu_run = kit.chosen(work, kit.gpu_cell(name))
    lines = [
        line
        for p in (work / "logs").glob("slurm-*.out")
        for line in p.read_text().splitlines()
        if line.startswith("amb-slurm:") and line.endswith(f"/{gpu_run}.json")
    ]
    assert lines and f" node={GPU_NODE} gpus=0 " in lines[-1], lines
    assert watch.gpu_env(gpu_run) == "0", watch.seen.get(gpu_run)
    # SLURM's own record of the first pass: n2's task ended with its node
    assert any(r.get("NodeList") == "n2" for r in _jobcomp(slurm_cluster)), _jobcomp(slurm_cluster)


def test_amb_sweep_cancel_stops_every_container_within_10s(tmp_path, slurm_cluster, docker_cli):
    _store, work, argv = kit.prepare(tmp_path, "cx", "slurm", "--no-score")
    env = _env(slurm_cluster)
    driver = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 300
    while not kit.running_containers(docker_cli, work):
        assert time.monotonic() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.2)
    t0 = time.monotonic()
    # --wait 30: the containers must stop on their own (each exec stops its own), not be removed by
    # cancel's last resort after its wait.
    cancel = subprocess.Popen(
        [str(kit.BIN / "amb"), "sweep", "cancel", "--wait", "30", str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    while kit.running_containers(docker_cli, work) and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    assert not kit.running_containers(docker_cli, work), "a container outlived amb sweep cancel by 10 s"
    _, said = cancel.communicate(timeout=60)
    assert cancel.returncode == 0 and "removed" not in said, said
    driver.communicate(timeout=120)
    deadline = time.monotonic() + 90  # a step still closing its run; SLURM's KillWait is 30 s
    while slurm_cluster.run(["squeue", "-h", "-o", "%i"]).stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert slurm_cluster.run(["squeue", "-h", "-o", "%i %T"]).stdout.strip() == ""


def test_amb_gc_as_the_job_epilog_cleans_up_after_a_killed_job(
    tmp_path, slurm_cluster, agent_image, docker_cli
):
    """A job killed outright, its amb-record with everything else of it (recorder, watchdog and agent
    at once, as a cgroup's kill or an OOM kill of the job does): the epilog's ``amb gc`` removes the
    run's container, network, firewall rules and temp dirs, and says so in its log.

    A plain ``scancel`` sends SIGTERM first, on which amb-record closes the run itself; so SIGKILL goes
    to the batch script (amb-record). This cluster tracks a job's processes by their parents, not by a
    cgroup, and the watchdog is in a session of its own: SLURM's kill would leave it, to clean up by
    itself. It is killed here first, as a cgroup's kill would."""
    run_id = f"epilog-{os.getpid()}"
    store = tmp_path / "store"
    job = tmp_path / "job.sh"
    job.write_text(
        f"#!/bin/sh\nexec {kit.BIN / 'amb-record'} --store {store} --backend docker --run-id {run_id} "
        "-- sleep 600\n"
    )
    env = {**_env(slurm_cluster), "AMB_AGENT_IMAGE": agent_image}
    submit = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path / 'job.out'}", f"--chdir={tmp_path}", str(job)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    lock = slurm_cluster.tmp / "amb-runs" / f"{run_id}.lock"
    deadline = time.monotonic() + 180
    while not _run_left(docker_cli, run_id, slurm_cluster.tmp)["running"]:
        assert time.monotonic() < deadline, (tmp_path / "job.out").read_text(errors="replace")
        time.sleep(0.3)
    watchdog = json.loads(lock.read_text())["watchdog"]
    before = _run_left(docker_cli, run_id, slurm_cluster.tmp)
    assert before["containers"] and before["networks"] and before["paths"], before

    os.kill(watchdog, signal.SIGKILL)
    slurm_cluster.run(["scancel", "--batch", "--signal=KILL", job_id])
    deadline = time.monotonic() + 120
    while (
        any((left := _run_left(docker_cli, run_id, slurm_cluster.tmp)).values())
        or lock.exists()
        or (job_id not in _epilogs(slurm_cluster))
    ):
        assert time.monotonic() < deadline, (left, _epilogs(slurm_cluster))
        time.sleep(0.5)
    status, said = _epilogs(slurm_cluster)[job_id]
    assert status == "0", (said, (tmp_path / "job.out").read_text(errors="replace"))
    removed = json.loads(said)["removed"]
    named = {r["name"] for r in removed if r["run_id"] == run_id}
    assert set(before["containers"] + before["networks"] + before["paths"]) <= named, removed
    assert len([r for r in removed if r["run_id"] == run_id and r["kind"] == "firewall_rule"]) == len(
        before["rules"]
    ), removed


def _run_left(client, run_id: str, tmp: Path) -> dict[str, list[str]]:
    containers = client.containers.list(
        all=True, filters={"label": f"org.amb.run={run_id}"}, ignore_removed=True
    )
    rules = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True).stdout
    return {
        "containers": sorted(c.name for c in containers),
        "running": [c.name for c in containers if c.status == "running"],
        "networks": sorted(n.name for n in client.networks.list(filters={"label": f"org.amb.run={run_id}"})),
        "rules": [line for line in rules.splitlines() if f"amb-run:{run_id}" in line],
        "paths": sorted(str(p) for p in tmp.glob(f"amb-*{run_id}-*")),
    }


def _epilogs(cluster: SlurmCluster) -> dict[str, tuple[str, str]]:
    """By job id: the epilog's exit status and what ``amb gc --json`` said before it."""
    text = cluster.epilog_log.read_text(errors="replace") if cluster.epilog_log.exists() else ""
    out: dict[str, tuple[str, str]] = {}
    said: list[str] = []
    for line in text.splitlines():
        if line.startswith("epilog: job "):
            job, _, status = line.removeprefix("epilog: job ").partition(": amb gc exited ")
            out[job] = (status, "\n".join(said))
            said = []
        else:
            said.append(line)
    return out
