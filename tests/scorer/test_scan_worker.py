"""Scanners that never end: a Python scanner that loops or sleeps is killed at its timeout with what
it started, a SQL query that runs on is interrupted at its own, and either way the run gets an error
row, the scan goes on, ``amb scan`` exits and the store verifies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replay.store import open_sql
from scorer import scan as scanning
from scorer import scan_results, scanners
from scorer.profile import load as load_profile

AMB = str(Path(sys.executable).parent / "amb")
RUNS = [f"run-{i}" for i in range(6)]

HANGS = """
import os
import subprocess
import sys
import time
from pathlib import Path

from amb.scan import Finding, scanner

PIDS = Path({pids!r})


@scanner(timeout=1)
def hangs(traj):
    print("a scanner's print goes to stderr")  # never into the worker's answers
    n = int(traj.run_id.split("-")[1])
    if n in (1, 2, 4):
        child = subprocess.Popen(["sleep", "1000"])
        PIDS.joinpath(f"{{n}}").write_text(f"{{os.getpid()}} {{child.pid}}")
    if n == 1:
        while True:
            pass
    if n == 2:
        time.sleep(10**6)
    if n == 4:
        os._exit(3)
    return Finding(value=True, explanation="ran to the end", events=[traj.processes[0][0]])


@scanner(timeout=30)
def steady(traj):
    return Finding(value=len(traj.processes), events=[traj.processes[0][0]])
"""


@pytest.fixture(scope="module")
def store(synthetic_store) -> Path:
    return synthetic_store("scan-hangs", len(RUNS), 2)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, is not alive)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _errors(store: Path) -> dict[tuple[str, str], str]:
    con = open_sql(store)
    try:
        return {(r["scanner"], r["run_id"]): r["error"] for r in scan_results.errors(con)}
    finally:
        con.close()


def test_a_python_scanner_that_hangs_is_killed_with_what_it_started(store, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    (tmp_path / "hangs.py").write_text(HANGS.format(pids=str(pids)))
    args = [AMB, "scan", str(tmp_path / "hangs.py"), *RUNS, "--store", str(store), "--json"]
    # The subprocess timeout is a guard against a hang, not a measure: the scan must end.
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)  # the scanner's prints did not reach stdout
    tallies = {s["name"]: s for s in out["scanners"]}
    assert (tallies["hangs"]["scanned"], tallies["hangs"]["errors"]) == (6, 3)
    assert (tallies["steady"]["scanned"], tallies["steady"]["errors"]) == (6, 0)  # the scan went on
    assert "a scanner's print goes to stderr" in done.stderr
    errors = {run: e for (name, run), e in _errors(store).items() if name == "hangs"}
    assert sorted(errors) == ["run-1", "run-2", "run-4"]
    assert errors["run-1"].startswith("timeout: still running after 1 s")
    assert errors["run-2"].startswith("timeout: still running after 1 s")
    assert "ended (exit code 3)" in errors["run-4"]
    started = [int(p) for f in pids.iterdir() for p in f.read_text().split()]
    assert len(started) == 6 and not [p for p in started if _alive(p)]  # workers and their children
    verified = subprocess.run([AMB, "verify", "--store", str(store)], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr


LONG_SQL = """-- timeout: 1
SELECT r.run_id, true AS value, 'never' AS explanation, [] AS events
FROM runs r, range(1000000000) a, range(1000000000) b WHERE a.range + b.range < 0
"""


def test_a_sql_scanner_past_its_timeout_is_interrupted_and_the_scan_goes_on(store, tmp_path):
    (tmp_path / "forever.sql").write_text(LONG_SQL)
    (tmp_path / "quick.sql").write_text(
        "SELECT run_id, count(*) AS value, 'events' AS explanation, [] AS events FROM events GROUP BY run_id"
    )
    found = scanners.load(str(tmp_path / "forever.sql")) + scanners.load(str(tmp_path / "quick.sql"))
    assert found[0].timeout_s == 1 and found[1].timeout_s == scanners.SQL_TIMEOUT_S
    _, [slow, quick], _ = scanning.scan(store, load_profile(None), found, runs=RUNS[:4])
    assert (slow.scanned, slow.errors) == (4, 4) and (quick.scanned, quick.errors) == (4, 0)
    errors = {run: e for (name, run), e in _errors(store).items() if name == "forever"}
    assert sorted(errors) == RUNS[:4]
    assert all(e == "timeout: the query ran past 1 s and was interrupted" for e in errors.values())
    verified = subprocess.run([AMB, "verify", "--store", str(store)], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr


def test_a_scan_from_a_process_holding_many_open_files(store, tmp_path):
    # Its pipes to the worker are numbered past 1,023, where select() refuses them.
    (tmp_path / "steady.py").write_text(HANGS.format(pids=str(tmp_path)))
    many = (
        "import os, sys; from amb.main import cli; "
        "held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]; "
        "cli(sys.argv[1:])"
    )
    args = [sys.executable, "-c", many, "scan", f"{tmp_path / 'steady.py'}:steady", "run-0"]
    done = subprocess.run(
        [*args, "--store", str(store), "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (tally,) = json.loads(done.stdout)["scanners"]
    assert (tally["name"], tally["errors"]) == ("steady", 0), tally
