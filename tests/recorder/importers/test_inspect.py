"""``amb import inspect``: logs written by Inspect's own ``write_eval_log`` (``.eval`` and ``.json``;
Inspect cannot run an eval offline here) import with every model and tool event, and cached
tokens counted as the project counts them (input includes cached input)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner

from amb.main import cli

INSPECT = "inspect-ai==0.3.285"


def _inspect():
    """Inspect AI is the optional ``inspect`` extra (CI installs it); install it here if missing."""
    try:
        import inspect_ai.log  # noqa: F401 - imported only to learn whether the extra is installed
    except ImportError:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", INSPECT], check=True
        )
    import inspect_ai.log

    return inspect_ai.log


T0 = datetime(2026, 4, 12, 10, 0, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def write_logs(tmp: Path) -> tuple[Path, Path]:
    log_api = _inspect()
    from inspect_ai.event import (
        InfoEvent,
        ModelEvent,
        SampleLimitEvent,
        SandboxEvent,
        ScoreEvent,
        ToolEvent,
    )
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalSample, EvalSpec
    from inspect_ai.model import (
        ChatCompletionChoice,
        ChatMessageAssistant,
        ChatMessageUser,
        GenerateConfig,
        ModelCall,
        ModelOutput,
        ModelUsage,
    )
    from inspect_ai.scorer import Score
    from inspect_ai.tool import ToolCall, ToolInfo

    user = ChatMessageUser(content="How many lesions are in the image?")
    tool = ToolInfo(name="bash", description="run bash")

    def model_event(i: int, text: str, calls: list[ToolCall], usage: ModelUsage, **kw) -> ModelEvent:
        msg = ChatMessageAssistant(content=text, tool_calls=calls or None)
        req: dict[str, Any] = {
            "model": "gpt-5",
            "messages": [{"role": "user", "content": user.text}],
            "tools": [],
        }
        return ModelEvent(
            uuid=f"model-{i}",
            timestamp=at(10 * i),
            completed=at(10 * i + 2),
            model="openai/gpt-5",
            input=[user],
            tools=[tool],
            tool_choice="auto",
            config=GenerateConfig(),
            output=ModelOutput(
                model="gpt-5-2026",
                choices=[ChatCompletionChoice(message=msg, stop_reason="tool_calls" if calls else "stop")],
                usage=usage,
            ),
            call=ModelCall(request=req, response={"id": f"resp-{i}"}),
            **kw,
        )

    call = ToolCall(id="tc-1", function="bash", arguments={"cmd": "ls /data"})
    events: list[Any] = [
        model_event(
            0,
            "Let me look.",
            [call],
            ModelUsage(
                input_tokens=100,
                output_tokens=20,
                total_tokens=1070,
                input_tokens_cache_read=900,
                input_tokens_cache_write=50,
                reasoning_tokens=5,
            ),
        ),
        SandboxEvent(
            timestamp=at(3),
            completed=at(4),
            action="exec",
            cmd="bash -c 'ls /data'",
            result=0,
            output="a.png\n",
        ),
        ToolEvent(
            timestamp=at(3),
            completed=at(4),
            id="tc-1",
            function="bash",
            arguments={"cmd": "ls /data"},
            result="a.png\n",
        ),
        model_event(
            1,
            "Two lesions.",
            [],
            ModelUsage(input_tokens=300, output_tokens=5, total_tokens=305),
            cache="read",
        ),
        InfoEvent(timestamp=at(12), data={"msg": "done"}),
        ScoreEvent(timestamp=at(13), score=Score(value=1.0, answer="two")),
    ]
    sample = EvalSample(
        id="q1",
        epoch=1,
        input="How many lesions are in the image?",
        target="two",
        messages=[user],
        events=events,
        started_at=T0.isoformat(),
        completed_at=at(14).isoformat(),
        total_time=14.0,
        uuid="sample-uuid-1",
    )
    limited = EvalSample(
        id="q2",
        epoch=1,
        input="x",
        target="y",
        events=[
            model_event(5, "thinking", [], ModelUsage(input_tokens=10, output_tokens=1, total_tokens=11)),
            SampleLimitEvent(timestamp=at(60), type="time", message="time limit 60 s", limit=60),
        ],
        started_at=at(40).isoformat(),
        completed_at=at(60).isoformat(),
        total_time=20.0,
    )
    spec = EvalSpec(
        created=T0.isoformat(),
        task="vqa-rad-task",
        model="openai/gpt-5",
        dataset=EvalDataset(name="vqa", samples=2, sample_ids=["q1", "q2"]),
        config=EvalConfig(),
        eval_id="eval-123",
        run_id="run-abc",
    )
    log = EvalLog(eval=spec, status="success", samples=[sample, limited])
    paths = tmp / "log.eval", tmp / "log.json"
    for p in paths:
        log_api.write_eval_log(log, str(p))
    return paths


def amb(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("suffix", [".eval", ".json"])
def test_inspect_logs_import_with_every_event(tmp_path, suffix):
    logs = write_logs(tmp_path)
    path = next(p for p in logs if p.suffix == suffix)
    store = tmp_path / "store"
    r = amb("import", "inspect", "--store", str(store), "--json", str(path))
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["status"] for x in rows] == ["imported", "imported"]
    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    q1, q2 = (x["run_id"] for x in rows)
    calls = con.execute(
        """SELECT call_id, provider, api, model, input_tokens, cache_read_tokens, cache_write_tokens,
                  output_tokens, reasoning_tokens FROM model_calls WHERE run_id = ? ORDER BY seq""",
        [q1],
    ).fetchall()
    # Inspect's input_tokens (100) excludes cached input (900 read, 50 written): ours includes it.
    assert calls == [
        ("model-0", "openai", "chat.completions", "gpt-5-2026", 1050, 900, 50, 20, 5),
        ("model-1", "openai", "chat.completions", "gpt-5-2026", 300, 0, 0, 5, 0),
    ]
    tools = con.execute(
        "SELECT tool_call_id, name, arguments, requested_in, answered_in, output FROM tool_calls "
        "WHERE run_id = ?",
        [q1],
    ).fetchall()
    assert tools == [("tc-1", "bash", '{"cmd":"ls /data"}', "model-0", "model-1", "a.png\n")]
    procs = con.execute("SELECT argv, exit_code FROM processes WHERE run_id = ?", [q1]).fetchall()
    assert [(json.loads(a) if isinstance(a, str) else list(a), c) for a, c in procs] == [
        (["bash", "-c", "ls /data"], 0)
    ]
    kinds = con.execute(
        "SELECT payload->>'$.data.kind' FROM events WHERE run_id = ? AND kind = 'note' ORDER BY seq", [q1]
    ).fetchall()
    assert sorted(k for (k,) in kinds) == ["inspect.cache_read", "inspect.info", "origin_scores"]
    run = con.execute("SELECT task, status, model, backend FROM runs WHERE run_id = ?", [q1]).fetchall()
    assert run == [("vqa-rad", "completed", "openai/gpt-5", "import")]
    assert con.execute("SELECT status FROM runs WHERE run_id = ?", [q2]).fetchall() == [("timeout",)]
    con.close()
    assert amb("verify", "--store", str(store)).exit_code == 0
    again = amb("import", "inspect", "--store", str(store), "--json", str(path))
    assert {x["status"] for x in json.loads(again.stdout)} == {"skipped"}


def test_a_log_whose_members_expand_past_the_file_cap_is_rejected_unread(tmp_path):
    """A zip bomb: 40 MB of members in a ~40 KB .eval, under a 10 MB cap. The sizes are the ones the
    zip declares, which Python's zipfile (Inspect's reader's) holds each member to."""
    import zipfile

    _inspect()
    bomb = tmp_path / "bomb.eval"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("header.json", b" " * (20 << 20))
        z.writestr("samples/1_epoch_1.json", b" " * (20 << 20))
    assert bomb.stat().st_size < 200_000
    store = tmp_path / "store"
    r = amb(
        "import", "inspect", "--store", str(store), "--json", "--max-file-bytes", str(10 << 20), str(bomb)
    )
    assert r.exit_code == 2, r.output
    row = json.loads(r.stdout)[0]
    assert row["status"] == "rejected", row
    assert f"its members expand to {40 << 20} bytes, above the {10 << 20}-byte file cap" in row["detail"]
    assert "Traceback" not in r.output and not store.exists()


@pytest.mark.parametrize("content", [b"PK\x03\x04 not really a zip", b"{not json", b'{"version": 2}'])
def test_broken_logs_are_rejected(tmp_path, content):
    _inspect()
    store = tmp_path / "store"
    bad = tmp_path / ("bad.eval" if content.startswith(b"PK") else "bad.json")
    bad.write_bytes(content)
    r = amb("import", "inspect", "--store", str(store), "--json", str(bad))
    assert r.exit_code == 2, r.output
    row = json.loads(r.stdout)[0]
    assert row["status"] == "rejected" and row["detail"], row
    assert "Traceback" not in r.output
    assert not store.exists()  # nothing written, not even an empty store
