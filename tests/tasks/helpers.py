"""Shared by the twin tests."""

from __future__ import annotations

import hashlib
from pathlib import Path

from schemas.task_spec import TaskSpec
from tasks.synth import synth


def digest_tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path) with the sha256 of its bytes: equal trees are
    byte-identical, and a failing comparison shows which files differ."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def twin_is_deterministic(spec: TaskSpec, root: Path, cases: int, seed: int) -> Path:
    """Make the twin twice with ``seed`` and once with ``seed + 1`` under ``root`` (``a``, ``b``, ``c``);
    the same seed must give byte-identical trees, the next one a different tree. Returns ``a``."""
    for name, s in (("a", seed), ("b", seed), ("c", seed + 1)):
        synth(spec, root / name, cases=cases, seed=s)
    assert digest_tree(root / "a") == digest_tree(root / "b")
    assert digest_tree(root / "a") != digest_tree(root / "c")
    return root / "a"
