"""Files that are shipped into an agent's sandbox as they are must not need this project.

``amb_agent.py`` runs in a bare agent container via ``python3 -c`` (standard library + ``openai``);
the baseline's kit is written into the workspace and run with whatever Python is there (standard
library only)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from agents import amb_agent
from agents.baseline import kit

ALLOWED = {"amb_agent.py": {"openai"}, "kit.py": set()}


def top_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_shipped_files_import_only_the_standard_library():
    for module in (amb_agent, kit):
        path = Path(str(module.__file__))
        extra = top_imports(path) - set(sys.stdlib_module_names) - ALLOWED[path.name] - {"__future__"}
        assert not extra, f"{path.name} imports {sorted(extra)}"


def test_agent_source_runs_as_a_dash_c_program(tmp_path):
    source = Path(amb_agent.__file__).read_text(encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-I", "-c", source, "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 0 and "--task-dir" in proc.stdout
