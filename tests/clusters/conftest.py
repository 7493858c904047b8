"""The real clusters of the scale-out tests, one of each per test session (tests/clusters/)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.clusters import sweep_kit as kit
from tests.clusters.ray_cluster import RayCluster, RayClusterError
from tests.clusters.slurm_cluster import ClusterError, SlurmCluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Controller + n1 (with one fake GPU) + n2, up for the session, torn down by PID."""
    try:
        cluster = SlurmCluster().start()
    except ClusterError as e:
        pytest.fail(f"the SLURM tests need a SLURM cluster: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """Head + one worker with a logical GPU, in a loopback-only network namespace, for the session."""
    try:
        cluster = RayCluster().start()
    except RayClusterError as e:
        pytest.fail(f"the Ray tests need a Ray cluster: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def local_reference(
    tmp_path_factory: pytest.TempPathFactory, agent_image: str, grader_image: str
) -> dict[str, dict[str, Any]]:
    """The engine tests' sweep run with the local executor: per cell, what every engine must equal.
    Locally the GPU cell's allocation comes from CUDA_VISIBLE_DEVICES (what a GPU box would set)."""
    tmp = tmp_path_factory.mktemp("local-reference")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    store, _work, proc = kit.run_sweep(tmp, "lr", "local", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = kit.by_cell(store, "lr")
    assert sorted(cells) == sorted(kit.cells("lr")) and all(c.get("scores") for c in cells.values()), cells
    return cells
