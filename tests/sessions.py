"""What the test processes of one session (pytest-xdist workers) share: a folder and locks in it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def shared_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of this test session that all its pytest-xdist workers share (the parent
    of each worker's own base folder; the base folder itself in a session of one process)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@contextlib.contextmanager
def one_worker_at_a_time(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[None]:
    """Held by one test process at a time: the lock file sits in the folder the workers share."""
    with open(shared_tmp(tmp_path_factory) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
