from __future__ import annotations

import pytest

from recorder.synthetic import generate_run
from replay.ingest import ingest


@pytest.fixture
def store(tmp_path):
    """A store with three synthetic runs, ingested."""
    root = tmp_path / "store"
    for i in range(3):
        generate_run(root, f"run-{i}", seed=i, calls=12)
    ingest(root)
    return root


@pytest.fixture(scope="session")
def viewer_store(tmp_path_factory):
    """Real recorded, synthetic, big and hostile runs, ingested and scored (tests/replay/viewer_store.py)."""
    from tests.replay.viewer_store import build

    return build(tmp_path_factory.mktemp("viewer"))


@pytest.fixture(scope="session")
def viewer(viewer_store):
    """`amb serve` over that store, on a loopback port, for the session."""
    from replay.web.server import Running

    with Running(viewer_store.root) as running:
        yield running
