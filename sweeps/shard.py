"""Shards: one run's spools and blobs in a directory of their own, under the sweep's shared root.

Layout of a shard root (a sweep's work directory, on a filesystem every node sees)::

    specs/<run id>.json                 the run spec of each attempt (written before submission)
    attempts/<run id>/<token>/          an execution in progress: a store layout (spool/, blobs/)
    shards/<run id>/                    a complete execution, renamed here in one step
        spool/<run id>/*.spool, blobs/, shard.json
    duplicates/<run id>/<token>/        a complete execution of an attempt that already had a shard
    cells/<cell key>                    the run id of the cell's first completed attempt (O_EXCL)
    logs/<run id>.log                   what the exec printed (local executor; engines keep their own)

How these make every attempt count once is in docs/scale-out.md (Exactly once in effect).
"""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

import msgspec

from schemas.durable import fsync_dir, read_small, write_durably
from schemas.errors import UsageError
from sweeps.spec import RunSpec, encode

SHARD_FILE = "shard.json"
EXEC_FILE = "exec.json"


class ShardInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``shard.json``: what the exec knows about one complete execution."""

    run_id: str
    cell: str
    attempt: int
    status: str
    """The run's status (completed, failed, timeout, killed, recorder_error)."""
    exit_code: int
    host: str
    pid: int
    token: str
    started_ns: int
    ended_ns: int
    run_s: float
    """The exec's call of the recorder, what any way of recording this run would take (the executor's
    overhead is the rest of the time from dispatch to the shard's rename)."""
    gpu_ids: list[str]
    cpus: float | None
    memory: str | None
    files: dict[str, int]
    """Every file of the shard (relative path -> size in bytes), shard.json excepted."""
    reason: str | None = None


class Layout:
    """The paths of one shard root."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.specs = self.root / "specs"
        self.attempts = self.root / "attempts"
        self.shards = self.root / "shards"
        self.duplicates = self.root / "duplicates"
        self.cells = self.root / "cells"
        self.logs = self.root / "logs"

    def spec_file(self, run_id: str) -> Path:
        return self.specs / f"{run_id}.json"

    def shard(self, run_id: str) -> Path:
        return self.shards / run_id

    def make(self) -> None:
        for d in (self.specs, self.attempts, self.shards, self.duplicates, self.cells, self.logs):
            d.mkdir(parents=True, exist_ok=True)


def new_token() -> str:
    """Names one execution: host, pid and time, so two executions of one spec never collide."""
    host = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())[:40]
    return f"{host}-{os.getpid()}-{time.time_ns():x}"


def write_spec(layout: Layout, spec: RunSpec) -> Path:
    path = layout.spec_file(spec.run_id)
    write_durably(path, encode(spec))
    return path


def file_sizes(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if rel != SHARD_FILE:
                out[rel] = p.lstat().st_size
    return dict(sorted(out.items()))


def _fsync_tree(root: Path) -> None:
    """Everything of the shard on disk before the rename makes it visible as complete."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def place(layout: Layout, attempt_dir: Path, info: ShardInfo) -> tuple[Path, bool]:
    """Seal ``attempt_dir`` (shard.json, fsync) and rename it into ``shards/<run id>``, or into
    ``duplicates/`` when another execution got there first (then False); a completed run that is the
    first of its cell also claims the cell."""
    write_durably(attempt_dir / SHARD_FILE, msgspec.json.encode(info))
    _fsync_tree(attempt_dir)
    target = layout.shard(info.run_id)
    try:
        os.rename(attempt_dir, target)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        dup = layout.duplicates / info.run_id / info.token
        dup.parent.mkdir(parents=True, exist_ok=True)
        os.rename(attempt_dir, dup)
        return dup, False
    if info.status == "completed":
        claim_cell(layout, info.cell, info.run_id)
    return target, True


def claim_cell(layout: Layout, cell_key: str, run_id: str) -> bool:
    """Create ``cells/<cell key>`` holding ``run_id`` unless it exists; True when this call made it."""
    path = layout.cells / cell_key
    tmp = path.with_name(f".{cell_key}.{run_id}.{os.getpid()}.tmp")
    tmp.write_text(run_id + "\n", encoding="utf-8")
    try:
        os.link(tmp, path)  # atomic and exclusive, also on NFS (where O_EXCL may not be)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def claimed_or_first(layout: Layout, cell_key: str, first: str | None) -> str | None:
    """The run id that holds the cell; when none does, ``first`` (its first completed attempt) claims
    it: the exec that completed it died between placing its shard and claiming the cell."""
    chosen = claimed(layout, cell_key)
    if chosen is None and first is not None:
        claim_cell(layout, cell_key, first)
        chosen = claimed(layout, cell_key)
    return chosen


def claimed(layout: Layout, cell_key: str) -> str | None:
    path = layout.cells / cell_key
    try:
        text = read_small(path).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the cell's claim: {e.strerror}") from None
    return text.strip() or None


def read_info(shard_dir: Path) -> ShardInfo:
    """A shard's ``shard.json`` (raises ``msgspec`` errors and ``OSError``; callers name the shard)."""
    return msgspec.json.decode(read_small(shard_dir / SHARD_FILE), type=ShardInfo)
