"""`amb demo`'s guards, which act before anything is recorded (the whole demo runs, from an installed
wheel and sdist, in tests/test_installed_package.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AMB = str(Path(sys.executable).parent / "amb")


def amb_demo(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "AMB_STORE"} | env
    return subprocess.run(
        [AMB, "demo", "--out", str(tmp_path / "out"), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        cwd=tmp_path,
    )


def test_a_store_the_demo_did_not_make_is_never_emptied(tmp_path):
    # AMB_STORE left exported for a real store: the demo (which empties its store) refuses it.
    store = tmp_path / "precious"
    store.mkdir()
    (store / "amb.duckdb").write_bytes(b"a user's store")
    proc = amb_demo(tmp_path, AMB_STORE=str(store))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"amb: error: --store {store} holds files the demo did not make")
    assert (store / "amb.duckdb").read_bytes() == b"a user's store"
    assert not (tmp_path / "out").exists()


def test_docker_backend_without_an_engine_is_one_clear_error(tmp_path):
    proc = amb_demo(tmp_path, "--backend", "docker", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "amb: error: --backend docker: no Docker engine answers (start one, or set DOCKER_HOST)"
    )
    # Its own store was made (and marked), so the next demo may empty it again.
    assert (tmp_path / "out" / "demo-store" / ".amb-demo").is_file()
