"""The SLURM and Ray executors' errors: one clear ``amb: error`` line naming the thing, never a
traceback. No cluster needed: these fail before any engine is reached."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.clusters import sweep_kit as kit


def _amb(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kit.BIN / "amb"), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    ("name", "garbage"),
    [("slurm", b"{not json"), ("ray", b'{"placements": 7}'), ("slurm", b'{"batches": [{"job_id": 1}]}')],
)
def test_a_damaged_executor_state_is_named(tmp_path: Path, name: str, garbage: bytes) -> None:
    state = tmp_path / "executor"
    state.mkdir()
    (state / "name").write_text(name + "\n")
    (state / f"{name}.json").write_bytes(garbage)
    proc = _amb("sweep", "cancel", str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr  # a usage error
    assert f"amb: error: {state / f'{name}.json'}: cannot read the" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_no_sbatch_on_path_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sweep.toml").write_text(kit.sweep_file("np"), encoding="utf-8")
    env = {**os.environ, "PATH": str(kit.BIN)}  # amb's own, and no SLURM client
    proc = subprocess.run(
        kit.sweep_argv(tmp_path / "sweep.toml", tmp_path / "store", tmp_path / "work", "slurm", "--no-score"),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr  # a usage error
    assert "amb: error: the SLURM executor needs sbatch on PATH" in proc.stderr
    assert "Traceback" not in proc.stderr
