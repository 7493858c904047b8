"""Which shards of a sweep go into the store: exactly one complete attempt per cell, never two.

From a shard root: every attempt's shard that is a cell's result (the run id in ``cells/<cell
key>``: the cell's first completed attempt) or a failed/stopped attempt (a record of what happened,
under its own run id, like any failed run). Completed attempts that are not their cell's result and
re-executions in ``duplicates/`` are kept on disk as recorded duplicates and listed, not loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from schemas.codec import ID_RE
from sweeps.shard import Layout, claimed, claimed_or_first, read_info
from sweeps.spec import parse_run_id


@dataclass
class Selection:
    take: list[tuple[Path, str]] = field(default_factory=list)
    """(shard dir, run id) to load."""
    duplicates: list[Path] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(path, why): shards whose name or shard.json cannot be trusted."""


def is_sweep_root(path: Path) -> bool:
    return (path / "shards").is_dir()


def takes(layout: Layout, shard_dir: Path) -> bool:
    """Whether a placed shard is one ingest takes (see the module's docstring)."""
    try:
        info = read_info(shard_dir)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return True  # let the loader refuse it with its reason
    return info.status != "completed" or claimed(layout, info.cell) == shard_dir.name


def select(layout: Layout) -> Selection:
    sel = Selection()
    try:
        names = sorted(os.listdir(layout.shards))
    except OSError:
        names = []
    completed: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        path = layout.shards / name
        if not ID_RE.match(name):
            sel.refused.append((str(path), "not a run id"))
            continue
        if path.is_symlink() or not path.is_dir():
            sel.refused.append((str(path), "not a folder (a symbolic link or a file)"))
            continue
        try:
            info = read_info(path)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
            sel.refused.append((str(path), f"no readable shard.json ({e})"))
            continue
        cell, attempt = parse_run_id(name)
        if info.run_id != name or info.cell != cell or info.attempt != attempt:
            why = f"shard.json claims run {info.run_id!r} (cell {info.cell!r}), the shard is {name!r}"
            sel.refused.append((str(path), why))
            continue
        if info.status == "completed":
            completed.setdefault(info.cell, []).append((attempt, name))
        else:
            sel.take.append((path, name))
    for cell, runs in sorted(completed.items()):
        chosen = claimed_or_first(layout, cell, min(runs)[1])
        for _attempt, name in sorted(runs):
            if name == chosen:
                sel.take.append((layout.shards / name, name))
            else:
                sel.duplicates.append(layout.shards / name)
    try:
        for rid in sorted(os.listdir(layout.duplicates)):
            sel.duplicates += sorted((layout.duplicates / rid).iterdir())
    except OSError:
        pass
    sel.take.sort(key=lambda t: t[1])
    return sel
