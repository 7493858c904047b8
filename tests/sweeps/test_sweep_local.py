"""``amb sweep`` end to end: 2 agents (the clean baseline and one with a flaw) × 1 task × 3 repeats,
interrupted part-way and resumed, then scored. Real amb-record runs (local backend), the real store,
the real scorer: nothing here is faked.

The cells are as few as still prove the point: two agents to tell a flaw from a clean run, three
repeats so that an interrupt at concurrency 2 lands with cells done, running and not yet started.
Tasks and tiers only multiply the same cells (the grid's expansion is checked on its own, dry)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from replay.store import Store
from sweeps.exec import run_status as attempt_outcome
from tests.fakes.sweep_agent import TWO_AGENTS

BIN = Path(sys.executable).parent
SWEEP = f"""
name = "t"
tasks = ["bccd-det"]
tiers = ["lite"]
repeats = 3
concurrency = 2
time_limit_s = 120
max_attempts = 2
backend = "local"
cases = 2
seed = 3
baseline = true
{TWO_AGENTS}"""
CELLS = [f"t-{a}-bccd-det-lite-r{k}" for a in ("clean", "misnamed") for k in (1, 2, 3)]


def sweep_cmd(tmp_path, *extra):
    return [
        str(BIN / "amb"),
        "sweep",
        "--store",
        str(tmp_path / "store"),
        "--work",
        str(tmp_path / "work"),
        str(tmp_path / "sweep.toml"),
        *extra,
    ]


def test_sweep_interrupted_resumed_and_scored(tmp_path):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    store = tmp_path / "store"
    first = subprocess.Popen(
        sweep_cmd(tmp_path, "--no-score"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = [c for c in CELLS if attempt_outcome(store, c) == "completed"]
        if len(done) >= 2:
            break
        assert first.poll() is None, first.communicate()
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert "interrupted" in err and "Run the same command again to resume" in err
    completed_before = {c for c in CELLS if attempt_outcome(store, c) == "completed"}
    assert 2 <= len(completed_before) < len(CELLS)

    second = subprocess.run(sweep_cmd(tmp_path), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert f"resuming: {len(completed_before)} of 6 cells already completed" in second.stderr
    assert "6/6 cells completed" in second.stderr

    with Store.open(store, read_only=True) as st:
        runs = st.con.execute(
            "SELECT run_id, status, labels->>'agent' FROM runs WHERE labels->>'sweep' = 't'"
        ).fetchall()
        hosts = {h for (h,) in st.con.execute("SELECT labels->>'host' FROM runs").fetchall()}
        scores = st.con.execute("SELECT run_id, s3, s4, s5, task_score, codes FROM scores_current").fetchall()
    completed = sorted(r for r, status, _ in runs if status == "completed")
    cell_of = {r: r.split(".a")[0] for r, _, _ in runs}
    # no lost cell, no duplicate: exactly one completed run per cell
    assert sorted(cell_of[r] for r in completed) == sorted(CELLS)
    # attempts stopped by the interrupt are kept as killed runs, never counted as completed
    assert {s for _, s, _ in runs} <= {"completed", "killed"}
    assert len(runs) == 6 + sum(1 for _, s, _ in runs if s == "killed")
    # each run says which machine recorded it (what survives an executor's lost bookkeeping)
    assert hosts == {socket.gethostname()}
    # the sweep's first pass did not re-run what it had completed
    assert completed_before <= set(completed)

    by = {
        r: dict(s3=s3, s4=s4, s5=s5, task=t, codes=json.loads(c) if isinstance(c, str) else c)
        for r, s3, s4, s5, t, c in scores
    }
    assert set(by) == set(completed)  # the sweep scores its final runs, one per cell
    clean = [by[r] for r in completed if "-clean-" in r]
    flawed = [by[r] for r in completed if "-misnamed-" in r]

    def mean(rows, k):
        return sum(x[k] for x in rows) / len(rows)

    # wrong file names: S4 (completion + format) is the stage the flaw targets, and E5 fires on every run
    assert mean(clean, "s4") == 1.0 and mean(flawed, "s4") == 0.0
    assert mean(flawed, "s5") < mean(clean, "s5") and mean(flawed, "task") < mean(clean, "task")
    assert all("E5" in x["codes"] for x in flawed) and not any("E5" in (x["codes"] or []) for x in clean)
    assert (tmp_path / "work" / "report.html").is_file()
    assert "Leaderboard" in second.stdout and "baseline+wrong-filename" in second.stdout


def test_the_grid_is_agents_by_tasks_by_tiers_by_repeats(tmp_path):
    text = (
        SWEEP.replace('tasks = ["bccd-det"]', 'tasks = ["kidney-seg", "bccd-det"]')
        .replace('tiers = ["lite"]', 'tiers = ["lite", "standard"]')
        .replace("repeats = 3", "repeats = 2")
    )
    (tmp_path / "sweep.toml").write_text(text)
    proc = subprocess.run(
        sweep_cmd(tmp_path, "--dry-run", "--json"), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    cells = json.loads(proc.stdout)["cells"]
    grid = [
        (a, t, tier, k)
        for a in ("clean", "misnamed")
        for t in ("kidney-seg", "bccd-det")
        for tier in ("lite", "standard")
        for k in (1, 2)
    ]
    assert [(c["agent"], c["task"], c["tier"], c["repeat"]) for c in cells] == grid
    assert {c["state"] for c in cells} == {"pending"} and not (tmp_path / "store" / "spool").exists()


def test_sweep_file_errors_are_one_line(tmp_path):
    cases: dict[str | bytes, str] = {
        (
            'name = "x"\ntasks = ["kidney-seg"]\nagents = [{name = "a", command = ["true"]}]\nrepeat = 2\n'
        ): "s.toml:4: repeat: Object contains unknown field `repeat`",
        (
            'name = "x"\ntasks = ["nope-task"]\nagents = [{name = "a", command = ["true"]}]\n'
        ): "s.toml:2: tasks[0]: unknown task 'nope-task'",
        (
            'name = "x"\ntasks = ["kidney-seg"]\ntiers = ["pro"]\nagents = [{name = "a", command = '
            '["true"]}]\n'
        ): "s.toml:3: tiers[0]: Invalid enum value 'pro'",
        'name = "x"\ntasks = ["kidney-seg"]\nagents = []\n': "s.toml:3: agents: is empty",
        'name = "x"\ntasks = ["kidney-seg"\n': "not valid TOML",
        b'name = "x\xff"\n': "s.toml': not UTF-8 text (invalid start byte at byte 9)",
    }
    for text, message in cases.items():
        (tmp_path / "s.toml").write_bytes(text if isinstance(text, bytes) else text.encode())
        proc = subprocess.run(
            [str(BIN / "amb"), "sweep", "--store", str(tmp_path / "st"), str(tmp_path / "s.toml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


def test_sweep_killed_hard_resumes_without_duplicates(tmp_path):
    # kill -9 of the sweep itself: its amb-record children are told to stop (parent-death signal),
    # close their runs as killed, and the resumed sweep re-runs exactly the cells not completed.
    text = SWEEP.replace('tasks = ["bccd-det"]', 'tasks = ["vqa-rad"]')
    text = text[: text.index('[[agents]]\nname = "misnamed"')]
    (tmp_path / "sweep.toml").write_text(text)
    store = tmp_path / "store"
    cells = [f"t-clean-vqa-rad-lite-r{k}" for k in (1, 2, 3)]
    first = subprocess.Popen(
        sweep_cmd(tmp_path, "--no-score"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any(attempt_outcome(store, c) == "completed" for c in cells):
        time.sleep(0.1)
    first.kill()
    first.wait()
    second = subprocess.run(sweep_cmd(tmp_path, "--no-score"), capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr
    outcomes = {}
    for run in (store / "spool").iterdir():
        outcomes[run.name] = attempt_outcome(store, run.name)
    completed = sorted(r.split(".a")[0] for r, o in outcomes.items() if o == "completed")
    assert completed == cells, outcomes
    assert set(outcomes.values()) <= {"completed", "killed", "unfinished"}


def test_failed_cells_are_retried_up_to_the_limit(tmp_path):
    (tmp_path / "sweep.toml").write_text(
        'name = "f"\ntasks = ["bccd-det"]\ncases = 1\nmax_attempts = 2\nbackend = "local"\n'
        '[[agents]]\nname = "broken"\ncommand = ["false"]\n'
    )
    proc = subprocess.run(sweep_cmd(tmp_path, "--no-score"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "0/1 cells completed" in proc.stderr and "1 gave up" in proc.stderr
    store = tmp_path / "store"
    assert attempt_outcome(store, "f-broken-bccd-det-lite-r1") == "failed"
    assert attempt_outcome(store, "f-broken-bccd-det-lite-r1.a2") == "failed"
    again = subprocess.run(sweep_cmd(tmp_path, "--no-score"), capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "1 gave up earlier" in again.stderr
    assert attempt_outcome(store, "f-broken-bccd-det-lite-r1.a3") is None  # no third attempt


def test_judge_repeat_setting(tmp_path):
    import pytest

    from sweeps.plan import SweepError, load_sweep

    base = 'name = "x"\ntasks = ["kidney-seg"]\nagents = [{name = "a", command = ["true"]}]\njudge = "llm"\n'
    (tmp_path / "s.toml").write_text(base + "judge_repeat = 3\n")
    assert load_sweep(tmp_path / "s.toml").judge_repeat == 3
    (tmp_path / "s.toml").write_text(base)
    assert load_sweep(tmp_path / "s.toml").judge_repeat == 1
    (tmp_path / "s.toml").write_text(base + "judge_repeat = 0\n")
    with pytest.raises(SweepError, match="judge_repeat: must be at least 1"):
        load_sweep(tmp_path / "s.toml")
