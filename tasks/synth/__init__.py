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


def case_dirs(spec: TaskSpec, out: Path, case: str) -> tuple[Path, Path]:
    """The public and private folders of ``case`` under ``out``, created."""
    sides = (
        out / "public" / spec.public.case_dir.format(case=case),
        out / "private" / spec.private.case_dir.format(case=case),
    )
    for side in sides:
        side.mkdir(parents=True, exist_ok=True)
    return sides


def reference_cases(private: Path, name: str) -> list[str]:
    """The case folders of a ``private/`` folder that hold a file ``name``, sorted."""
    if not private.is_dir():
        return []
    return sorted(p.name for p in private.iterdir() if (p / name).is_file())


def copy_references(spec: TaskSpec, data: Path, workspace: Path, pattern: str, name: str = "") -> None:
    """The perfect submission of a track whose outputs are its references: each private
    ``<case>/<pattern>`` file copied to ``<workspace>/<root>/<case>/`` (renamed to ``name``)."""
    for src in sorted((data / "private").glob(f"*/{pattern}")):
        dest = workspace / spec.submission.root / src.parent.name / (name or src.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)


def fresh_sides(out: Path) -> None:
    """Empty ``out/public`` and ``out/private``: a twin is written afresh, never over an old one."""
    for side in (out / "public", out / "private"):
        if side.exists():
            shutil.rmtree(side)
        side.mkdir(parents=True)
