"""The real clusters of the scale-out tests (tests/clusters/), each up for the tests of its one file
(test_slurm.py, test_ray.py) and stopped after them: a cluster left up for the rest of the session
spends a core's tenth on its daemons' polling while the other files run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.clusters import sweep_kit as kit
from tests.clusters.ray_cluster import RayCluster, RayClusterError
from tests.clusters.slurm_cluster import ClusterError, SlurmCluster
from tests.sessions import one_worker_at_a_time, shared_tmp


def _up(cluster: Any, failure: type[Exception], engine: str) -> Iterator[Any]:
    """``cluster`` started for the session (a failure to start fails the tests that need it, saying
    why), and stopped after it."""
    try:
        cluster.start()
    except failure as e:
        pytest.fail(f"the {engine} tests need a {engine} cluster: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Controller + n1 (with one fake GPU) + n2, up for the file's tests, torn down by PID."""
    yield from _up(SlurmCluster(), ClusterError, "SLURM")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """Head + one worker with a logical GPU, in a loopback-only network namespace, for the file's tests."""
    yield from _up(RayCluster(), RayClusterError, "Ray")


@pytest.fixture(scope="session")
def local_reference(
    tmp_path_factory: pytest.TempPathFactory, agent_image: str, grader_image: str
) -> dict[str, dict[str, Any]]:
    """The engine tests' sweep run with the local executor: per cell, what every engine must equal.
    Locally the GPU cell's allocation comes from CUDA_VISIBLE_DEVICES (what a GPU box would set).

    Run once per test session: the SLURM and the Ray tests may sit in two test processes, and the
    second one reads what the first one wrote (the cells as JSON, in the folder they share)."""
    with one_worker_at_a_time(tmp_path_factory, "local-reference"):
        saved = shared_tmp(tmp_path_factory) / "local-reference.json"
        if saved.exists():
            cells: dict[str, dict[str, Any]] = json.loads(saved.read_text(encoding="utf-8"))
            return cells
        tmp = tmp_path_factory.mktemp("local-reference")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
        store, work, proc = kit.run_sweep(tmp, "lr", "local", env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        cells = kit.by_cell(store, "lr", work)
        assert sorted(cells) == sorted(kit.cells("lr")), cells
        assert all(c.get("scores") for c in cells.values()), cells
        saved.write_text(json.dumps(cells), encoding="utf-8")
        return cells
