"""Converters from the real public datasets' own layouts into a task's public/private layout.

A task names its converter in ``spec.toml`` (``converter = "kits19"``); the module
``tasks.convert.<name>`` exposes ``prepare(spec, source, out, progress=None) -> None`` (``progress``
takes each finished case id). Naming the module in the spec (rather than in a table here) lets each
track add converters without touching this file.
A converter reads only ``source`` and writes only ``out``; a source that does not have the expected
layout is one ``TaskError`` naming the missing or unreadable path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from schemas.task_spec import TaskError, TaskSpec


def prepare(spec: TaskSpec, source: Path, out: Path, progress: Callable[[str], None] | None = None) -> None:
    """Convert ``source`` into ``out/public`` and ``out/private``."""
    if not spec.converter:
        raise TaskError(f"task {spec.id}: no converter from its public dataset yet")
    source = Path(source)
    if not source.is_dir():
        raise TaskError(f"--source {source}: not a directory")
    name = f"tasks.convert.{spec.converter}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        raise TaskError(f"task {spec.id}: converter module {name} does not exist") from e
    module.prepare(spec, source, Path(out), progress=progress)
