"""`amb-record --shim`: a local run recorded like a container run (processes and file changes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb

BIN = Path(sys.executable).parent

SCRIPT = """
set -e
mkdir -p plan agents_outputs/case_1
printf '# Plan\\n1. pilot\\n' > plan/plan.md
python3 -c "open('agents_outputs/case_1/out.txt', 'w').write('x' * 100)"
sh -c 'exit 0'
mv agents_outputs/case_1/out.txt agents_outputs/case_1/final.txt
rm -f plan/scratch.txt
exit 3
"""


def test_local_run_under_the_shim(tmp_path):
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [
            str(BIN / "amb-record"),
            "--store",
            str(store),
            "--run-id",
            "shimmed",
            "--shim",
            "--",
            "bash",
            "-c",
            SCRIPT,
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr  # the agent's exit code, through the shim
    assert proc.stdout.strip().splitlines()[-1] == "shimmed"
    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    writes = {
        p: s for p, s in con.execute("SELECT path, size FROM file_writes WHERE run_id = 'shimmed'").fetchall()
    }
    assert writes.get("plan/plan.md") == len("# Plan\n1. pilot\n")
    assert "agents_outputs/case_1/out.txt" in writes or "agents_outputs/case_1/final.txt" in writes
    renamed = con.execute(
        "SELECT count(*) FROM events WHERE run_id = 'shimmed' AND kind = 'file.renamed'"
    ).fetchall()[0][0]
    assert renamed == 1
    cmds = [c for (c,) in con.execute("SELECT cmd FROM processes WHERE run_id = 'shimmed'").fetchall()]
    assert any(c.startswith("bash -c") for c in cmds)
    assert any("python3 -c" in c for c in cmds)
    tracers = {
        t for (t,) in con.execute("SELECT DISTINCT tracer FROM processes WHERE run_id = 'shimmed'").fetchall()
    }
    assert tracers & {"seccomp-notify", "strace", "proc-poll"}
    verified = subprocess.run(
        [str(BIN / "amb"), "verify", "--store", str(store)], capture_output=True, text=True
    )
    assert verified.returncode == 0, verified.stdout


def test_shim_is_for_the_local_backend(tmp_path):
    proc = subprocess.run(
        [str(BIN / "amb-record"), "--store", str(tmp_path), "--backend", "docker", "--shim", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2
        and "--shim is for the local backend" in proc.stderr
        and "Traceback" not in proc.stderr
    )
