"""Synthetic twins: small generated data sets in each task's exact public/private layout.

One module per track, ``tasks.synth.<track>``, each exposing

- ``synth(spec, out, cases, seed) -> None``: writes ``out/public/...`` and ``out/private/...``,
  deterministic for a seed;
- ``perfect_submission(spec, data, workspace) -> None``: writes into ``workspace`` (shaped like
  the agent's workspace) the submission the grader must score 1.0. Tests use it; agents never do.

Modules are imported lazily, so one track's missing optional dependency never breaks another.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from types import ModuleType

from schemas.task_spec import TaskError, TaskSpec

DEFAULT_CASES = 3
"""Case count of a twin when none is given: enough for per-case edge cases, fast to grade."""


def track_module(track: str) -> ModuleType:
    """The synth module of ``track``."""
    name = f"tasks.synth.{track}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        raise TaskError(f"no synthetic twin generator for track {track!r} yet") from e


def synth(spec: TaskSpec, out: Path, cases: int | None = None, seed: int = 0) -> None:
    """Write the synthetic twin of ``spec`` into ``out`` (``public/`` and ``private/``)."""
    n = DEFAULT_CASES if cases is None else cases
    if n < 1:
        raise TaskError(f"--cases must be at least 1, got {n}")
    track_module(spec.track).synth(spec, Path(out), n, seed)


def perfect_submission(spec: TaskSpec, data: Path, workspace: Path) -> None:
    """Write the submission that reproduces the twin's references exactly."""
    track_module(spec.track).perfect_submission(spec, Path(data), Path(workspace))


def fresh_sides(out: Path) -> tuple[Path, Path]:
    """``out/public`` and ``out/private``, emptied: a twin is written afresh, never over an old one."""
    sides = out / "public", out / "private"
    for side in sides:
        if side.exists():
            shutil.rmtree(side)
        side.mkdir(parents=True)
    return sides
