"""Shared by the grader tests."""

from __future__ import annotations

import shutil
from pathlib import Path


def output_file(ws: Path, case: str, name: str) -> Path:
    """``ws/agents_outputs/<case>/<name>``, its folder made: where an agent writes a case's output."""
    path = ws / "agents_outputs" / case / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def fresh_dir(path: Path) -> Path:
    """``path`` as a new empty folder (hypothesis runs one test function many times in one tmp_path)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def place(path: Path, content: str | bytes | None) -> None:
    """Write ``content`` at ``path``, its folder made. ``None`` leaves the file missing; ``"DIR"``
    puts a folder where the file should be (hostile submissions)."""
    if content is None:
        return
    if content == "DIR":
        path.mkdir(parents=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
