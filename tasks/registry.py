"""Finds and loads the task specs: one folder per task under ``tasks/`` with ``spec.toml`` and briefs.

A task folder is data, not a Python package: ``spec.toml`` (decoded into ``schemas.task_spec.TaskSpec``),
``lite.md`` and ``standard.md`` (the two tiers' briefs). The folder name is the task id.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from pathlib import Path

from schemas.errors import quoted
from schemas.task_spec import TIERS, TaskError, TaskSpec, UnknownTask, decode_spec


def tasks_root() -> Path:
    """The folder that holds the task folders (inside the installed ``tasks`` package)."""
    return Path(str(resources.files("tasks")))


def task_ids() -> list[str]:
    """Every task id, sorted."""
    return sorted(p.parent.name for p in tasks_root().glob("*/spec.toml"))


@cache
def _known_ids() -> frozenset[str]:
    return frozenset(task_ids())


LEGACY_ALIASES = {"kidney": "kidney-seg", "pancreas": "pancreas-seg"}
"""AutoMedBench's seg runner still accepts bare organ names (``--task kidney``) and writes them
into its logs (``conversation.json`` ``task`` is the organ)."""

BENCHMARK_SUFFIX = "-task"
"""AutoMedBench names each task folder ``<id>-task`` (``kidney-seg-task``); its logs carry that name."""


def canonical_id(task_id: str) -> str:
    """The project's id for ``task_id``, which may be the benchmark's own name (``kidney-seg-task``)
    or a legacy alias (``kidney``). An id that is already canonical, or unknown, comes back as is."""
    known = _known_ids()
    if task_id in known:
        return task_id
    if task_id.endswith(BENCHMARK_SUFFIX) and task_id[: -len(BENCHMARK_SUFFIX)] in known:
        return task_id[: -len(BENCHMARK_SUFFIX)]
    return LEGACY_ALIASES.get(task_id, task_id)


def load_spec(task_id: str) -> TaskSpec:
    """The spec of ``task_id`` (or of the task an alias names; see ``canonical_id``); an unknown id
    or a malformed spec is one ``TaskError`` line."""
    return _load_spec(canonical_id(task_id))


@cache
def _load_spec(task_id: str) -> TaskSpec:
    if task_id not in _known_ids():  # (never a path: an id is one of the task folders)
        known = ", ".join(task_ids()) or "none"
        raise UnknownTask(f"unknown task {quoted(task_id)} (known: {known})")
    path = tasks_root() / task_id / "spec.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"tasks/{task_id}/spec.toml: {e}") from e
    spec = decode_spec(data, source=f"tasks/{task_id}/spec.toml")
    if spec.id != task_id:
        raise TaskError(f"tasks/{task_id}/spec.toml: id {spec.id!r} does not match its folder")
    return spec


def all_specs() -> list[TaskSpec]:
    """Every task's spec, sorted by id."""
    return [load_spec(t) for t in task_ids()]


def brief(task_id: str, tier: str) -> str:
    """The brief the agent gets for ``task_id`` at ``tier`` (``lite`` or ``standard``)."""
    if tier not in TIERS:
        raise TaskError(f"unknown tier {tier!r} (expected one of {', '.join(TIERS)})")
    task_id = load_spec(task_id).id
    path = tasks_root() / task_id / f"{tier}.md"
    if not path.is_file():
        raise TaskError(f"task {task_id}: no {tier} brief (tasks/{task_id}/{tier}.md)")
    return path.read_text(encoding="utf-8")
