"""Shards made the way ``amb sweep exec`` makes them, with synthetic runs (the real spool writer, the
real blob store) in place of recorded agents, so that shard handling is tested in milliseconds."""

from __future__ import annotations

import os
import time
from pathlib import Path

from recorder.synthetic import generate_run
from sweeps.shard import Layout, ShardInfo, file_sizes, new_token, place
from sweeps.spec import Cell, run_id


def make_shard(
    layout: Layout, cell: Cell, attempt: int = 1, *, status: str = "completed", calls: int = 2, seed: int = 0
) -> tuple[Path, bool]:
    """One complete execution of ``cell``'s attempt, placed like the exec places it."""
    rid = run_id(cell, attempt)
    token = new_token() + f"-{os.urandom(2).hex()}"
    attempt_dir = layout.attempts / rid / token
    attempt_dir.mkdir(parents=True)
    generate_run(attempt_dir, rid, seed=seed, calls=calls)
    now = time.time_ns()
    info = ShardInfo(
        run_id=rid,
        cell=cell.key,
        attempt=attempt,
        status=status,
        exit_code=0 if status == "completed" else 1,
        host="test",
        pid=os.getpid(),
        token=token,
        started_ns=now,
        ended_ns=now,
        run_s=0.0,
        gpu_ids=[],
        cpus=None,
        memory=None,
        files=file_sizes(attempt_dir),
    )
    return place(layout, attempt_dir, info)
