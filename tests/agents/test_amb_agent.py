"""amb-agent, recorded by amb-record against the loopback baseline server, on a real task twin.

The recording must look like an AutoMedBench run: the same two tools, one API call per turn, every
tool call answered in the next request with ``{exit_code, stdout, stderr}``, stage-labelled code,
and a final ``submit_results`` whose result is never sent (the run ends there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.amb_agent import STDERR_KEEP, STDOUT_KEEP, run_code
from agents.baseline.server import BaselineServer
from replay.read import iter_events
from replay.store import Store
from schemas.blobstore import BlobStore
from schemas.events import ModelCallCompleted, SubmissionSealed, ToolCallRequested, ToolCallResult
from scorer.grader import grade
from tasks.registry import brief, load_spec
from tests.fakes.baseline_run import record_baseline_run
from tests.fakes.upstream import FakeUpstream

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def server():
    with BaselineServer() as s:
        yield s


@pytest.fixture(scope="module")
def twin(make_twin):
    return make_twin("bccd-det", 2, 11)


def record(tmp_path, server, twin, run_id, *agent_args, tier="standard", model="baseline"):
    ws = tmp_path / f"ws-{run_id}"
    store = tmp_path / "store"
    proc = record_baseline_run(
        store,
        server.url,
        twin,
        ws,
        task="bccd-det",
        tier=tier,
        run_id=run_id,
        model=model,
        agent_args=agent_args,
        timeout=120,
    )
    return proc, ws, store


def test_recorded_run_has_automedbench_shape(tmp_path, server, twin):
    proc, ws, store = record(tmp_path, server, twin, "agent-1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "agent-1"
    with Store.open(store, read_only=True) as st:
        events = list(iter_events(st.con, "agent-1"))
        status = st.con.execute("SELECT status FROM runs WHERE run_id = 'agent-1'").fetchall()
    assert status == [("completed",)]
    blobs = BlobStore(store / "blobs")
    calls = [e.payload for e in events if isinstance(e.payload, ModelCallCompleted)]
    requested = [e.payload for e in events if isinstance(e.payload, ToolCallRequested)]
    results = {e.payload.tool_call_id: e.payload for e in events if isinstance(e.payload, ToolCallResult)}
    assert len(calls) == 10  # turns = API calls: 9 code runs + 1 submit, as in the paper's example
    assert [c.message.tool_calls[0].name for c in calls] == ["execute_code"] * 9 + ["submit_results"]
    assert [r.name for r in requested] == ["execute_code"] * 9 + ["submit_results"]
    stages = [json.loads(r.arguments)["code"].split("\n", 1)[0] for r in requested[:-1]]
    assert [s.split()[1] for s in stages] == ["S1", "S1", "S2", "S2", "S2", "S3", "S3", "S4", "S5"]
    for turn, call in enumerate(calls):
        assert call.request is not None
        body = json.loads(blobs.get(call.request))
        assert sorted(t["function"]["name"] for t in body["tools"]) == ["execute_code", "submit_results"]
        assert body["tool_choice"] == "auto" and body["temperature"] == 0.0 and body["max_tokens"] == 4096
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["system", "user"] + ["assistant", "tool"] * turn  # one tool call per turn here
        assert "Blood Cell Detection (STANDARD)" in body["messages"][0]["content"]
        if turn:
            last = json.loads(body["messages"][-1]["content"])
            assert set(last) >= {"exit_code", "stdout", "stderr"} and last["exit_code"] == 0
    # every execute_code was answered, submit_results was not (the run ended on it)
    assert set(results) == {r.tool_call_id for r in requested[:-1]}
    sealed = [e.payload for e in events if isinstance(e.payload, SubmissionSealed)][0]
    paths = {f.path for f in sealed.files}
    assert {"plan/plan.md", "plan/plan.png", "agents_outputs/case_00000/prediction.json"} <= paths
    assert not any(p.startswith(".amb_exec_") for p in paths)  # the harness cleans its temp files
    assert grade(load_spec("bccd-det"), ws, twin / "private").score > 0


def test_turn_cap_stops_without_submission(tmp_path, server, twin):
    proc, _, store = record(tmp_path, server, twin, "agent-cap", "--max-turns", "3")
    assert proc.returncode == 2
    assert "turn cap of 3 reached without a submission" in proc.stderr
    with Store.open(store, read_only=True) as st:
        assert st.con.execute(
            "SELECT status, n_model_calls FROM runs WHERE run_id = 'agent-cap'"
        ).fetchall() == [("failed", 3)]


def test_reply_without_tool_call_stops(tmp_path):
    # An outside model that answers a tool result with plain text (the fake provider does).
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "tier_prompt.txt").write_text(brief("vqa-rad", "lite"))
    with FakeUpstream() as fake:
        env = dict(os.environ, OPENAI_BASE_URL=fake.url + "/v1", OPENAI_API_KEY="k")
        proc = subprocess.run(
            [str(BIN / "amb-agent"), "--model", "m", "--task-dir", str(ws), "--data", str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2, proc.stderr
    assert "turn 1: read_file" in proc.stderr  # the fake's tool is not one of ours: answered, not run
    assert "replied without a tool call" in proc.stderr


def _record_without_agent_data(tmp_path, server, run_id, *record_args):
    """amb-record [record_args] -- amb-agent, the agent given no --data of its own."""
    ws = tmp_path / f"ws-{run_id}"
    ws.mkdir()
    (ws / "tier_prompt.txt").write_text(brief("bccd-det", "lite"))
    store = tmp_path / "store"
    proc = subprocess.run(
        [
            str(BIN / "amb-record"),
            *("--store", str(store), "--run-id", run_id, "--upstream", f"openai={server.url}"),
            *record_args,
            "--",
            *(str(BIN / "amb-agent"), "--model", "baseline", "--task-dir", ".", "--max-turns", "1"),
        ],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
    )
    with Store.open(store, read_only=True) as st:
        events = list(iter_events(st.con, run_id))
        status = st.con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
    return proc, events, status


def test_the_agent_finds_the_data_amb_record_gives_it(tmp_path, server, twin):
    # amb-record --data exports AMB_DATA; the reference agent reads that very name.
    _, events, _ = _record_without_agent_data(tmp_path, server, "agent-data", "--data", str(twin))
    first = next(e.payload for e in events if isinstance(e.payload, ModelCallCompleted))
    assert first.request is not None
    system = json.loads(BlobStore(tmp_path / "store" / "blobs").get(first.request))["messages"][0]["content"]
    assert f"Task data (read-only): {(twin / 'public').resolve()}\n" in system


def test_an_agent_without_data_fails_loudly(tmp_path, server):
    # No --data anywhere and no /data/public on this machine: the agent says what it looked for and
    # the run ends failed, before a single model call.
    assert not Path("/data/public").exists()
    proc, events, status = _record_without_agent_data(tmp_path, server, "agent-nodata")
    assert proc.returncode == 1 and status == "failed"
    assert (
        "amb-agent: error: no task data at /data/public (the default): give --data DIR, or record with "
        "amb-record --data DIR (it sets AMB_DATA)"
    ) in proc.stderr
    assert not any(isinstance(e.payload, ModelCallCompleted) for e in events)


def test_missing_brief_is_one_clear_error(tmp_path):
    proc = subprocess.run(
        [str(BIN / "amb-agent"), "--model", "m", "--task-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        == f"amb-agent: error: no brief: give --brief FILE or put tier_prompt.txt in {tmp_path.resolve()}"
    )


def test_tool_results_are_cut_like_automedbench(tmp_path):
    code = "import sys\nprint('A' * 5000 + 'END')\nsys.stderr.write('e' * 4000 + 'ERR')\nsys.exit(3)\n"
    r = run_code("python", code, tmp_path, 30, 1)
    assert r["exit_code"] == 3
    assert (
        r["stdout"].endswith("END\n")
        and len(r["stdout"]) < STDOUT_KEEP + 60
        and "characters cut" in r["stdout"]
    )
    assert r["stderr"].endswith("ERR") and len(r["stderr"]) < STDERR_KEEP + 60
    assert list(tmp_path.iterdir()) == []  # the script file is removed


def test_exec_timeout_and_bad_language(tmp_path):
    r = run_code("bash", "sleep 5", tmp_path, 0.5, 1)
    assert r["exit_code"] == 124 and "TIMEOUT" in r["stderr"]
    assert run_code("ruby", "puts 1", tmp_path, 5, 2)["exit_code"] == 2
