"""Tripwires: the dependency direction of DESIGN.md section 2, and stored-event hygiene."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ["schemas", "recorder", "replay", "scorer", "tasks", "agents", "images", "sweeps", "amb"]

ALLOWED = {
    "schemas": set(),
    "recorder": {"schemas"},
    "replay": {"schemas"},
    "tasks": {"schemas"},
    "scorer": {"schemas", "replay", "tasks"},
    "agents": {"schemas", "tasks"},
    "images": set(),
    # Sweeps compose the recorder (one run per shard), the store (ingest of shards), the tasks and
    # the offline baseline; nothing below imports them.
    "sweeps": {"schemas", "recorder", "replay", "tasks", "agents"},
    "amb": set(PACKAGES) - {"amb"},
}
THIRD_PARTY_IN_SCHEMAS = {"msgspec"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def sources(package: str):
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_dependency_direction(package):
    for path in sources(package):
        bad = (imports(path) & set(PACKAGES)) - ALLOWED[package] - {package}
        assert not bad, (
            f"{path.relative_to(ROOT)} imports {sorted(bad)}; {package} may import only "
            f"{sorted(ALLOWED[package])}"
        )


def test_schemas_is_pure():
    import sys

    stdlib = set(sys.stdlib_module_names)
    for path in sources("schemas"):
        extra = imports(path) - stdlib - THIRD_PARTY_IN_SCHEMAS - {"schemas"}
        assert not extra, (
            f"{path.relative_to(ROOT)} imports {sorted(extra)}: schemas is msgspec + stdlib only"
        )


def test_no_omit_defaults_on_events():
    for path in sources("schemas"):
        text = path.read_text(encoding="utf-8")
        assert "omit_defaults=True" not in text, f"{path}: stored events must keep every field"
