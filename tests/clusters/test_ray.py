"""The Ray executor on a real Ray cluster (head + a worker with one logical GPU, in a network namespace
with only ``lo``: tests/clusters/ray_cluster.py). The sweep driver runs inside that namespace too, as a
Ray Job on the head node (submitted through the Jobs API), so no test traffic leaves loopback.

The same sweep as the SLURM tests (tests/clusters/sweep_kit.py), and the same bar: the store equals the
local executor's, cell for cell; the GPU cell ran on the GPU node with that node's GPU id; killing the
worker mid-sweep, then resuming, loses no cell and leaves no container; ``amb sweep cancel`` stops every
container within 10 s."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from sweeps.shard import read_info
from tests.clusters import sweep_kit as kit
from tests.clusters.ray_cluster import RayCluster

pytestmark = pytest.mark.long(minutes=7)  # minutes: a real Ray cluster and two docker sweeps on it


def _ray(cluster: RayCluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.netns([str(cluster.bin / "ray"), *args]),
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=timeout,
    )


def _submit_job(cluster: RayCluster, job_id: str, argv: list[str]) -> None:
    proc = _ray(
        cluster,
        "job",
        "submit",
        "--no-wait",
        f"--address={cluster.dashboard_url}",
        f"--submission-id={job_id}",
        "--",
        *argv,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


_ASK_STATUS = """
import json, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to the loopback API
print(json.load(opener.open(sys.argv[1], timeout=20))["status"])
"""


def _job_status(cluster: RayCluster, job_id: str) -> str:
    """The job's status as the Jobs API gives it (``ray job status`` prints it in words that differ
    per status, e.g. "was stopped"), asked from inside the cluster's namespace, where the API is."""
    url = f"{cluster.dashboard_url}/api/jobs/{job_id}"
    argv = cluster.netns([str(cluster.bin / "python"), "-c", _ASK_STATUS, url])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else "?"


def _wait_job(cluster: RayCluster, job_id: str, timeout: float = 400) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = _job_status(cluster, job_id)
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status
        time.sleep(1)
    return "TIMEOUT"


def _job_logs(cluster: RayCluster, job_id: str) -> str:
    return _ray(cluster, "job", "logs", f"--address={cluster.dashboard_url}", job_id).stdout


def _gpu_node_id(cluster: RayCluster) -> str:
    proc = _ray(cluster, "list", "nodes", "--format=json", f"--address={cluster.address}")
    nodes = json.loads(proc.stdout)
    gpu = [n["node_id"] for n in nodes if n.get("resources_total", {}).get("GPU") and n["state"] == "ALIVE"]
    assert len(gpu) == 1, nodes
    return str(gpu[0])


def _placements(work: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((work / "executor" / "ray.json").read_text())["placements"]
    return data


HOLD_S = 30.0
"""How long the first container is held paused at most: well within the sweep's time limit (60 s),
so that the held run, should it complete, completes as it would have."""


def _two_at_once(cluster: RayCluster, client: Any, work: Path) -> Any:
    """Waits until a container runs on each node (each takes one: its ``docker`` resource). The first
    is paused meanwhile (the cgroup freezer: its agent just waits), so that a loaded machine, whose
    other node is slow to start its task, cannot let it finish first. Returns the held container."""
    deadline = time.monotonic() + 300
    held: Any = None
    since, let_go = 0.0, set[str]()
    try:
        while len(running := kit.running_containers(client, work)) < 2:
            assert time.monotonic() < deadline, _job_logs(cluster, "amb-sweep-1")[-3000:]
            fresh = [name for name in running if name not in let_go]
            if held is None and fresh:
                with contextlib.suppress(docker.errors.APIError):  # it ended in between: the next
                    container = client.containers.get(fresh[0])
                    container.pause()
                    held, since = container, time.monotonic()
            elif held is not None and time.monotonic() - since > HOLD_S:
                _let_go(held)  # held long enough: its run goes on, and the next one is held
                let_go.add(held.name)
                held = None
            time.sleep(0.3)
    except BaseException:
        _let_go(held)
        raise
    return held


def _let_go(held: Any) -> None:
    if held is not None:
        with contextlib.suppress(docker.errors.APIError):  # gone with its node: nothing to let go
            held.unpause()


def test_a_ray_sweep_survives_a_dead_worker_and_equals_the_local_sweep(
    tmp_path, ray_cluster, local_reference, docker_cli
):
    name = "lr"  # the local reference's name: the same cells, the same run ids
    store, work, argv = kit.prepare(tmp_path, name, "ray")
    watch = kit.ContainerWatch(docker_cli, work)
    try:
        _submit_job(ray_cluster, "amb-sweep-1", argv)
        # The worker node dies while a run of it has its container up; the sweep's job is stopped.
        held = _two_at_once(ray_cluster, docker_cli, work)
        gpu_node_before = _gpu_node_id(ray_cluster)  # the worker comes back with a new node id
        ray_cluster.kill_worker()
        _let_go(held)
        _ray(ray_cluster, "job", "stop", f"--address={ray_cluster.dashboard_url}", "amb-sweep-1")
        assert _wait_job(ray_cluster, "amb-sweep-1", timeout=120) in ("STOPPED", "FAILED")
        ray_cluster.restart_worker()
        # Resumed: the same command, as a new job.
        _submit_job(ray_cluster, "amb-sweep-2", argv)
        status = _wait_job(ray_cluster, "amb-sweep-2")
    finally:
        watch.stop()
    logs = _job_logs(ray_cluster, "amb-sweep-2")
    assert status == "SUCCEEDED", logs[-3000:]
    n = len(kit.cells(name))
    assert f"{n}/{n} cells completed" in logs
    kit.assert_equals_local(store, work, name, local_reference, docker_cli)
    # the GPU cell ran on the GPU node with that node's GPU id, which its container got
    placements = _placements(work)
    # The GPU cell's run lands in the first job (before its node died) or in the second, often
    # last: the driver stops as soon as the last shard lands, and its executor waits for the
    # task's return. Either way it ran on the GPU node, in one of its two lives.
    gpu_run = kit.chosen(work, kit.gpu_cell(name))
    assert placements[gpu_run]["node_id"] in (gpu_node_before, _gpu_node_id(ray_cluster))
    assert placements[gpu_run]["gpu_ids"] == ["0"]
    assert watch.gpu_env(gpu_run) == "0", watch.seen.get(gpu_run)
    assert len({p["node_id"] for p in placements.values() if p["node_id"]}) >= 2  # both nodes took work
    # Every run that completed has its placement, also one whose task returned while the first
    # job's driver was being stopped (its task wrote its own).
    completed = [
        i.run_id for i in (read_info(d) for d in (work / "shards").iterdir()) if i.status == "completed"
    ]
    assert completed and all(placements.get(r, {}).get("node_id") for r in completed), (completed, placements)


def test_amb_sweep_cancel_stops_every_container_within_10s(tmp_path, ray_cluster, docker_cli):
    _store, work, argv = kit.prepare(tmp_path, "rx", "ray", "--no-score")
    _submit_job(ray_cluster, "amb-cancel", argv)
    deadline = time.monotonic() + 120
    while not kit.running_containers(docker_cli, work):
        assert time.monotonic() < deadline, _job_logs(ray_cluster, "amb-cancel")[-3000:]
        time.sleep(0.2)
    t0 = time.monotonic()
    # --wait 30: the containers must stop on their own (each exec stops its own), not be removed by
    # cancel's last resort after its wait.
    cancel = subprocess.Popen(
        ray_cluster.netns([str(kit.BIN / "amb"), "sweep", "cancel", "--wait", "30", str(work)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ray_cluster.env, "RAY_DASHBOARD_ADDRESS": ray_cluster.dashboard_url},
    )
    while kit.running_containers(docker_cli, work) and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    assert not kit.running_containers(docker_cli, work), "a container outlived amb sweep cancel by 10 s"
    _, said = cancel.communicate(timeout=60)
    assert cancel.returncode == 0 and "removed" not in said, said
    assert _wait_job(ray_cluster, "amb-cancel", timeout=60) in ("STOPPED", "FAILED")
    # Each exec closed its run, although Ray SIGKILLs the driver 3 s after its SIGTERM and then the
    # tasks' workers and their direct children: the exec, behind a stand-in, got SIGTERM instead.
    deadline = time.monotonic() + 60
    while left := sorted(p.parent.name for p in (work / "attempts").glob("*/*")):
        assert time.monotonic() < deadline, f"attempts never closed: {left}"
        time.sleep(0.2)
    shards = [read_info(d) for d in (work / "shards").iterdir()]
    ended = [f"{s.run_id}: {s.status} ({s.reason})" for s in shards]
    assert shards and {s.status for s in shards} <= {"killed", "completed"}, (
        ended,
        _job_logs(ray_cluster, "amb-cancel")[-3000:],
    )
