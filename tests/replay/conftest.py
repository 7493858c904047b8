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
