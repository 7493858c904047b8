"""Shared by the twin tests."""

from __future__ import annotations

import hashlib
from pathlib import Path


def digest_tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path) with the sha256 of its bytes: equal trees are
    byte-identical, and a failing comparison shows which files differ."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
