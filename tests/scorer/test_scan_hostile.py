"""Scanners that return what the store cannot keep as it is (NaN, huge text, millions of findings,
an exception that cannot say what it is), and validations that name nothing: each is one error that
names the run or the thing, the other runs are scanned, never a traceback, a timeout or a silent
value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replay.store import open_sql
from schemas.errors import BadInput
from scorer import scan as scanning
from scorer import scan_results, scanners
from scorer.profile import load as load_profile

AMB = str(Path(sys.executable).parent / "amb")
RUNS = [f"run-{i}" for i in range(6)]

BAD = """
from amb.scan import Finding, scanner


class Unsayable(Exception):
    def __str__(self):
        raise ValueError("no message")


@scanner(timeout=20)
def bad(traj):
    n = int(traj.run_id.split("-")[1])
    if n == 0:
        return Finding(value=float("nan"))
    if n == 1:
        return Finding(value=float("-inf"))
    if n == 2:
        return Finding(value=True, explanation="x" * 50_000_000)
    if n == 3:
        return [Finding(value=True)] * 10_001
    if n == 4:
        raise Unsayable()
    return Finding(value=True, events=[traj.processes[0][0]])
"""

NAN_SQL = """
SELECT run_id, CASE WHEN run_id = 'run-0' THEN 'nan'::DOUBLE ELSE 1.5 END AS value,
       'a number' AS explanation, []::VARCHAR[] AS events
FROM runs
"""


@pytest.fixture(scope="module")
def store(synthetic_store) -> Path:
    return synthetic_store("scan-hostile", len(RUNS), 2)


def _errors(store: Path, scanner: str) -> dict[str, str]:
    con = open_sql(store)
    try:
        return {r["run_id"]: r["error"] for r in scan_results.errors(con) if r["scanner"] == scanner}
    finally:
        con.close()


def _scanned_rows(store: Path) -> int:
    con = open_sql(store)
    try:
        return con.execute("SELECT count(*) FROM scan_results").fetchall()[0][0]
    finally:
        con.close()


def _amb(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AMB, *args], capture_output=True, text=True, timeout=600)


def test_findings_the_store_cannot_keep_are_each_runs_error(store, tmp_path):
    (tmp_path / "bad.py").write_text(BAD)
    found = scanners.load(str(tmp_path / "bad.py"))
    _, [t], _ = scanning.scan(store, load_profile(None), found, runs=RUNS)
    assert (t.scanned, t.errors, t.flagged) == (6, 5, 1)
    errors = _errors(store, "bad")
    assert sorted(errors) == RUNS[:5]
    assert errors["run-0"] == "Malformed: a finding's value is nan, not a finite number"
    assert errors["run-1"] == "Malformed: a finding's value is -inf, not a finite number"
    assert errors["run-2"].startswith("Malformed: a finding's explanation is 50000000 characters long")
    assert errors["run-3"].startswith("Malformed: returned 10001 findings for one run")
    assert errors["run-4"].startswith(
        "Unsayable: (its message cannot be shown: its __str__ raised ValueError"
    )
    listed = _amb("scan", "--store", str(store), "--errors", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {r["run_id"] for r in json.loads(listed.stdout) if r["scanner"] == "bad"} == set(RUNS[:5])


def test_a_sql_scanners_nan_is_that_runs_error_and_the_others_are_kept(store, tmp_path):
    (tmp_path / "nan.sql").write_text(NAN_SQL)
    _, [t], _ = scanning.scan(store, load_profile(None), scanners.load(str(tmp_path / "nan.sql")), runs=RUNS)
    assert (t.scanned, t.errors, t.flagged) == (6, 1, 5)
    assert _errors(store, "nan") == {"run-0": "Malformed: a finding's value is nan, not a finite number"}


def test_validating_what_the_labels_or_the_store_lack_is_one_line(store, tmp_path):
    (tmp_path / "ok.py").write_text(
        "from amb.scan import Finding, scanner\n\n@scanner\ndef never(traj):\n    return None\n"
    )
    labels = tmp_path / "labels.csv"
    labels.write_text("run_id,target,value\nrun-0,scanner:never,true\nrun-1,scanner:ghost,false\n")
    s = str(store)
    assert _amb("labels", "import", "--store", s, str(labels), "--name", "pilot").returncode == 0
    before = _scanned_rows(store)
    missing_set = _amb("scan", "--store", s, str(tmp_path / "ok.py"), "--all", "--validate", "nope")
    assert missing_set.returncode == 2 and missing_set.stderr.strip() == (
        "amb: error: no label set 'nope' in this store: import one with `amb labels import`"
    )
    assert _scanned_rows(store) == before  # refused before anything was scanned
    for args, said in [
        (
            ["--scanner", "other"],
            "label set 'pilot' has no scanner:other labels (it labels the scanners: ghost, never)",
        ),
        (["--scanner", "ghost"], "scanner 'ghost' has no results in this store"),
        (
            ["--judge", "offline:rules-v1"],
            "label set 'pilot' labels no codes or item:<id> to validate a judge",
        ),
    ]:
        got = _amb("labels", "validate", "--store", s, "pilot", *args)
        assert got.returncode == 2 and got.stdout == "", (args, got.stderr)
        assert got.stderr.startswith(f"amb: error: {said}") and got.stderr.count("\n") == 1, got.stderr
    assert _amb("scan", "--store", s, str(tmp_path / "ok.py"), "--all").returncode == 0
    never = _amb("labels", "validate", "--store", s, "pilot", "--scanner", "never", "--json")
    assert never.returncode == 0, never.stderr
    [result] = json.loads(never.stdout)["results"]
    # A check that never fires: no precision (nothing flagged), recall 0 of the 1 labelled yes.
    assert (result["runs"], result["precision"], result["recall"]) == (1, None, 0.0)


def test_a_run_whose_text_holds_a_lone_surrogate_reaches_a_python_scanner_escaped(tmp_path):
    """An agent's JSON may escape a lone surrogate, which the worker's pipe (UTF-8) cannot carry: the
    scanner sees it escaped, as the evidence view shows it, and a scanner that makes one of its own
    gets that run's error."""
    from scorer.scan_worker import Workers
    from scorer.trajectory import Message, Trajectory

    (tmp_path / "echo.py").write_text(
        "from amb.scan import Finding, scanner\n\n@scanner\ndef echo(traj):\n"
        "    return Finding(explanation=traj.messages[0].text)\n\n"
        "@scanner\ndef makes_one(traj):\n    return Finding(value='\\ud800')\n"
    )
    found = scanners.load(str(tmp_path / "echo.py"))
    traj = Trajectory(run_id="r", messages=[Message(id="proxy:1", role="user", text="look \ud800 here")])
    workers = Workers(found)
    try:
        echoed, made = workers.run(traj, found)
    finally:
        workers.close()
    assert echoed.error is None and echoed.found[0].explanation == "look \\ud800 here"
    assert made.error == "Malformed: a finding's value holds a lone surrogate, which is no UTF-8 text"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("import sys\nsys.exit(0)\n", "fails to import: SystemExit: 0"),
        ("@scanner(timeout='10')\ndef s(traj):\n    return None\n", "@scanner(timeout='10'): give a number"),
        ("@scanner(timeout=float('inf'))\ndef s(traj):\n    return None\n", "@scanner(timeout=inf): give"),
        ("@scanner(timeout=float('nan'))\ndef s(traj):\n    return None\n", "@scanner(timeout=nan): give"),
        ("@scanner(timeout=0)\ndef s(traj):\n    return None\n", "@scanner(timeout=0): give a number"),
        ("@scanner(kinds='process.exited')\ndef s(traj):\n    return None\n", "give a list of event kinds"),
    ],
)
def test_a_scanner_file_that_exits_or_sets_no_usable_timeout_is_refused_at_load(tmp_path, text, said):
    """Before any run is scanned: a file that calls sys.exit() at import (which ended `amb scan`
    with exit 0 and nothing scanned), or a timeout that is no number of seconds above 0 (a
    traceback, or every run a timeout)."""
    path = tmp_path / "s.py"
    path.write_text("from amb.scan import Finding, scanner\n\n" + text)
    with pytest.raises(BadInput) as e:
        scanners.load(str(path))
    assert said in str(e.value) and "s.py" in str(e.value)


@pytest.mark.parametrize("name", ["q.sql", "q.toml"])
def test_a_scanner_file_that_is_not_text_is_refused_naming_it(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"SELECT '\xff'")
    with pytest.raises(BadInput) as e:
        scanners.load(str(path))
    assert str(e.value) == f"scanner {str(path)!r}: not UTF-8 text (invalid start byte at byte 8)"


def test_a_sql_scanners_timeout_of_zero_is_refused(tmp_path):
    path = tmp_path / "z.sql"
    path.write_text(
        "-- timeout: 0\nSELECT run_id, true AS value, '' AS explanation, [] AS events FROM runs\n"
    )
    with pytest.raises(BadInput, match="give a number of seconds above 0"):
        scanners.load(str(path))


def test_what_a_scanner_prints_of_the_agents_text_reaches_the_terminal_escaped(store, tmp_path):
    (tmp_path / "esc.py").write_text(
        "from amb.scan import scanner\n\n@scanner\ndef esc(traj):\n"
        "    print('agent says \\x1b]0;owned\\x07\\x1b[31mRED')\n    return None\n"
    )
    done = _amb("scan", "--store", str(store), str(tmp_path / "esc.py"), "run-0")
    assert done.returncode == 0, done.stderr
    assert "agent says \\x1b]0;owned\\x07\\x1b[31mRED\n" in done.stderr and "\x1b" not in done.stderr
