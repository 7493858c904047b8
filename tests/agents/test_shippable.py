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
from agents.baseline import kit, kit_lib, steps

ALLOWED = {"amb_agent.py": {"openai"}, "kit_lib.py": set(), "kit.py": {"amb_kit_lib", "agents"}}
"""kit.py imports the library under its shipped name, and in this repository under its own."""


def top_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_shipped_files_import_only_the_standard_library():
    for module in (amb_agent, kit, kit_lib):
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


def test_the_kit_runs_as_shipped_without_this_project(tmp_path):
    # As the baseline's setup step writes it: the pipeline and its library, side by side, imported
    # by a Python that cannot see this repository (no environment, no site-packages: -E -s -S).
    (tmp_path / "amb_kit_lib.py").write_text(steps.KIT_LIB_SOURCE.read_text(encoding="utf-8"))
    (tmp_path / "amb_kit.py").write_text(steps.KIT_SOURCE.read_text(encoding="utf-8"))
    probe = (
        "import amb_kit, amb_kit_lib, sys; "
        "assert 'agents' not in sys.modules; "
        "assert amb_kit.read_nifti is amb_kit_lib.read_nifti; "
        "print(amb_kit.VERSION, callable(amb_kit.run_case), callable(amb_kit.check_case))"
    )
    proc = subprocess.run(
        [sys.executable, "-E", "-s", "-S", "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [kit.VERSION, "True", "True"]
