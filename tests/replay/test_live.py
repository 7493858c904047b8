"""replay/live: following spools as they grow (a frame half written, a corrupt frame, a spool that
appears late), and `amb watch` over them, without ever writing to the store."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from amb.main import cli
from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay.ingest import ingest
from replay.live import RunFollower, SpoolTail
from schemas.events import (
    FileWritten,
    ModelCallCompleted,
    RunFinished,
    RunStarted,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from schemas.prices import load_table


def _call(i: int, model: str = "z-ai/glm-5") -> ModelCallCompleted:
    return ModelCallCompleted(
        call_id=f"c{i}",
        provider="openai",
        api="chat.completions",
        model=model,
        usage=Usage(input_total=1000 * i, output=10 * i),
    )


def test_a_half_written_frame_waits_for_the_next_poll(tmp_path):
    path = spool_path(tmp_path, "r", "proxy")
    with SpoolWriter(path, "r", "proxy") as w:
        w.append(_call(1))
        w.append(_call(2))
    whole = path.read_bytes()
    cut = whole.rfind(b"\n", 0, len(whole) - 1) + 1 + 40  # 40 bytes into the second frame
    path.write_bytes(whole[:cut])
    tail = SpoolTail(path)
    assert [e.seq for e in tail.poll()] == [0]
    assert tail.torn == 40
    assert tail.poll() == []  # nothing new: the offset stays after the last complete frame
    with open(path, "ab") as f:
        f.write(whole[cut:])
    assert [e.seq for e in tail.poll()] == [1]
    assert tail.torn == 0 and tail.offset == len(whole)


def test_a_spool_cut_inside_its_header_and_a_corrupt_frame(tmp_path):
    path = tmp_path / "x.spool"
    path.write_bytes(b"AMBSP")
    assert SpoolTail(path).poll() == []
    run_dir = tmp_path / "spool" / "bad"
    with SpoolWriter(spool_path(tmp_path, "bad", "proxy"), "bad", "proxy") as w:
        w.append(_call(1))
    spool = run_dir / "proxy.spool"
    data = bytearray(spool.read_bytes())
    data[-5] ^= 1  # a flipped byte in a complete frame: corruption, not a torn tail
    spool.write_bytes(bytes(data))
    follower = RunFollower(run_dir)
    assert follower.poll()
    assert follower.state.error is not None and "checksum mismatch" in follower.state.error


def test_watch_follows_a_run_as_its_spools_grow_and_never_writes(tmp_path):
    store = tmp_path / "store"
    follower = RunFollower(store / "spool" / "live")
    assert not follower.poll() and follower.state.view()["status"] == "waiting"
    rec = SpoolWriter(spool_path(store, "live", "recorder"), "live", "recorder")
    rec.append(RunStarted(agent="a", model="z-ai/glm-5", time_limit_s=600))
    proxy = SpoolWriter(spool_path(store, "live", "proxy"), "live", "proxy")
    proxy.append(_call(1))
    proxy.append(
        ToolCallRequested(
            tool_call_id="t1", name="execute_code", arguments='{"code": "ls"}', model_call_id="c1"
        )
    )
    assert follower.poll()
    view = follower.state.view()
    assert view["status"] == "running" and view["step"] == 1 and view["tokens"]["input"] == 1000
    assert view["last_tool_call"]["name"] == "execute_code" and view["last_tool_call"]["result"] is None
    assert 0 < view["remaining_s"] <= 600
    # The shim's spool appears later; the watcher picks it up.
    shim = SpoolWriter(spool_path(store, "live", "shim"), "live", "shim")
    shim.append(FileWritten(path="plan/plan.md", op="created", size=5, sha256="sha256:" + "0" * 64))
    proxy.append(_call(2))
    proxy.append(ToolCallResult(tool_call_id="t1", model_call_id="c2", output="ok"))
    before = sorted(os.listdir(store)), sorted(os.listdir(store / "spool" / "live"))
    result = CliRunner().invoke(cli, ["watch", "live", "--json", "--once", "--store", str(store)])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output)
    assert line["model_calls"] == 2 and line["tokens"] == {
        "input": 3000,
        "cache_read": 0,
        "output": 30,
        "reasoning": 0,
    }
    assert line["cost_usd"] == round((3000 * 0.72 + 30 * 2.30) / 1e6, 6)  # GLM-5 in the default table
    assert line["last_file"] == {"event": "shim:0", "op": "created", "path": "plan/plan.md", "size": 5}
    assert line["last_tool_call"]["result"] == {"event": "proxy:3", "is_error": None, "output": "ok"}
    rec.append(RunFinished(status="completed", exit_code=0))
    for w in (rec, proxy, shim):
        w.close()
    result = CliRunner().invoke(cli, ["watch", "live", "--store", str(store)])  # the table; exits: finished
    assert result.exit_code == 0 and "completed" in result.output and "plan/plan.md" in result.output
    assert (sorted(os.listdir(store)), sorted(os.listdir(store / "spool" / "live"))) == before
    assert not (store / "amb.duckdb").exists()


def test_a_cost_nobody_priced_reads_unknown_not_zero(tmp_path):
    store = tmp_path / "store"
    with SpoolWriter(spool_path(store, "free", "proxy"), "free", "proxy") as w:
        w.append(_call(1))
    unpriced = RunFollower(store / "spool" / "free")  # no price table given
    assert unpriced.poll() and unpriced.state.view()["cost_usd"] is None
    priced = RunFollower(store / "spool" / "free", prices=load_table("openrouter-2026-05-28"))
    assert priced.poll() and priced.state.view()["cost_usd"] == round((1000 * 0.72 + 10 * 2.30) / 1e6, 6)


def test_watch_usage_errors(tmp_path):
    for args, code, message in [
        ([], 2, "give RUN ids, --sweep DIR or --all-running"),
        (["r", "--all-running"], 2, "give RUN ids, --sweep DIR or --all-running"),
        (["../etc"], 2, "amb: error: '../etc' is not a run id"),
        # (a run not started yet is waited for; --wait-start 0 says not found at once)
        (
            ["nope", "--wait-start", "0"],
            3,
            f"amb: error: no run 'nope' at {tmp_path}: no spools of it and no store",
        ),
        (["nope", "--interval", "nan"], 2, "--interval nan: must be a positive number of seconds"),
        (["--sweep", str(tmp_path / "nope")], 3, "no such directory"),
    ]:
        result = CliRunner().invoke(cli, ["watch", *args, "--store", str(tmp_path)])
        assert result.exit_code == code and message in result.output, (args, result.output)


def test_hostile_strings_are_shown_as_text(tmp_path):
    """Markup and terminal escapes in what the agent wrote are shown, never interpreted."""
    evil = "[/bold][link=http://127.0.0.1/]x[/link] \x1b[2J\x1b]0;owned\x07"
    store = tmp_path / "store"
    with SpoolWriter(spool_path(store, "evil", "recorder"), "evil", "recorder") as rec:
        rec.append(RunStarted(agent=evil, model=evil))
        with SpoolWriter(spool_path(store, "evil", "proxy"), "evil", "proxy") as proxy:
            proxy.append(_call(1, model=evil))
            proxy.append(ToolCallRequested(tool_call_id="t", name=evil, arguments=evil, model_call_id="c1"))
        with SpoolWriter(spool_path(store, "evil", "shim"), "evil", "shim") as shim:
            shim.append(FileWritten(path=evil, size=1, sha256="sha256:" + "0" * 64))
        rec.append(RunFinished(status="completed"))
    result = CliRunner().invoke(cli, ["watch", "evil", "--store", str(store)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "[/bold][link=http://127.0.0.1/]x[/link]" in result.output
    result = CliRunner().invoke(cli, ["watch", "evil", "--json", "--store", str(store)])
    assert json.loads(result.output)["last_file"]["path"] == evil


def test_all_running_and_a_sweep(tmp_path):
    store = tmp_path / "store"
    for run_id, done in (("old", True), ("busy", False), ("cell-1", False)):
        with SpoolWriter(spool_path(store, run_id, "recorder"), run_id, "recorder") as rec:
            rec.append(RunStarted(agent="a"))
            if done:
                rec.append(RunFinished(status="completed"))
    result = CliRunner().invoke(cli, ["watch", "--all-running", "--json", "--once", "--store", str(store)])
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(line)["run_id"] for line in result.output.splitlines()) == ["busy", "cell-1"]
    # A sweep's shard root: a complete shard, an attempt still recording, a spec not started yet,
    # and names that are no run ids (ignored).
    sweep = tmp_path / "sweep"
    for run_id, where, done in (
        ("cell-1", sweep / "shards" / "cell-1", True),
        ("cell-3", sweep / "attempts" / "cell-3" / "node-1-42-abc", False),
    ):
        with SpoolWriter(spool_path(where, run_id, "recorder"), run_id, "recorder") as rec:
            rec.append(RunStarted(agent="a"))
            if done:
                rec.append(RunFinished(status="completed"))
    (sweep / "specs").mkdir()
    (sweep / "specs" / "cell-2.json").write_text("{}")
    (sweep / "specs" / "not a run id.json").write_text("{}")
    (sweep / "specs" / "README").write_text("")
    result = CliRunner().invoke(
        cli, ["watch", "--sweep", str(sweep), "--json", "--once", "--store", str(store)]
    )
    assert result.exit_code == 0, result.output
    views = {v["run_id"]: v for v in map(json.loads, result.output.splitlines())}
    assert set(views) == {"cell-1", "cell-2", "cell-3"}
    assert views["cell-1"]["status"] == "completed"
    assert views["cell-3"]["status"] == "running" and views["cell-2"]["status"] == "waiting"


def _watch_json(store) -> dict:
    result = CliRunner().invoke(cli, ["watch", "gen", "--json", "--once", "--store", str(store)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("how", ["compress", "drop", "no-spools"])
def test_watch_reads_an_ingested_run_as_it_read_it_recording(tmp_path, how):
    # ingest compresses (or drops) a finished run's spools: the watcher reads them there, or the store.
    store = tmp_path / "store"
    generate_run(store, "gen", seed=1, calls=6)
    live = _watch_json(store)
    assert live["status"] == "completed" and live["model_calls"] == 6 and live["tokens"]["input"] > 0
    ingest(store, spool_mode="keep" if how == "no-spools" else how)
    if how == "no-spools":  # a run that came in by `amb ingest --from` or an import: no spool here
        shutil.rmtree(store / "spool" / "gen")
    else:
        assert not list((store / "spool" / "gen").glob("proxy.spool"))
    assert _watch_json(store) == live


def test_an_unknown_price_is_shown_as_unknown(tmp_path):
    store = tmp_path / "store"
    generate_run(store, "gen", seed=1, calls=3)  # its models are not in the default price table
    line = _watch_json(store)
    assert line["cost_usd"] is None and line["cost_reason"].startswith("not in price table ")
    args = ["watch", "gen", "--once", "--store", str(store)]
    result = CliRunner().invoke(cli, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(x for x in result.output.splitlines() if x.strip().startswith("gen "))
    assert "unknown" in row.split() and "0.0000" not in row
