"""Google's Gemini CLI (npm ``@google/gemini-cli``), unchanged, under ``amb-record`` against a
scripted loopback Gemini upstream: it completes a small file-writing task, and every one of its model
calls and tool calls is in the store, with the real key only upstream.

The CLI is configured as a user would: ``GOOGLE_GEMINI_BASE_URL`` and ``GEMINI_API_KEY`` come from
amb-record; its settings file picks API-key auth (with a base URL set and no setting, 0.61 picks its
"gateway" auth, which its headless mode then refuses); ``--skip-trust`` and ``--yolo`` let it write in
a folder it has not seen before without asking."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.amb.test_record_cli import amb, assert_no_key_bytes, run_id_of, sql
from tests.fakes.agents import gemini_cli
from tests.fakes.harness import REAL_KEYS
from tests.fakes.upstream import FakeUpstream

BIN = Path(sys.executable).parent
CONTENT = "hello from the Gemini CLI\n"


@pytest.fixture(scope="session")
def gemini():
    return gemini_cli()


def test_gemini_cli_writes_a_file_and_every_call_is_recorded(tmp_path, gemini):
    store, ws, home = tmp_path / "store", tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    (home / ".gemini").mkdir(parents=True)
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    shutil.copytree(home, tmp_path / "home-before")
    target = ws / "hello.txt"
    script = [{"name": "write_file", "args": {"file_path": str(target), "content": CONTENT}}]
    cli = [str(gemini), "-p", "Write hello.txt with a greeting", "--yolo", "--skip-trust"]

    def record(*options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "amb-record"), "--store", str(store), *options, "--", *cli],
            cwd=ws,
            env={**os.environ, **REAL_KEYS, "HOME": str(home)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=240,
        )

    with FakeUpstream(host="127.0.0.1", gemini_script=script) as fake:
        res = record("--upstream", f"gemini={fake.url}")
        seen = list(fake.requests)
    assert res.returncode == 0, res.stderr[-3000:]
    assert target.read_text() == CONTENT
    run_id = run_id_of(res)

    # Every request the CLI made to the model API is one recorded model call, and nothing else.
    assert seen and all(":" in s.path.rsplit("/", 1)[-1] for s in seen)
    assert all(s.headers.get("x-goog-api-key") == REAL_KEYS["GEMINI_API_KEY"] for s in seen)
    calls = sql(
        store,
        "SELECT call_id, api, requested_model, served_model, ok, n_tool_calls, input_tokens, output_tokens "
        f"FROM model_calls WHERE run_id = '{run_id}' ORDER BY seq",
    )
    assert len(calls) == len(seen) and all(c["ok"] for c in calls)
    assert [c["requested_model"] for c in calls] == [s.path.rsplit("/", 1)[-1].split(":")[0] for s in seen]
    assert all(c["served_model"] == c["requested_model"] + "-001" for c in calls)
    assert sum(c["api"] == "streamGenerateContent" for c in calls) >= 2
    # usageMetadata by hand (the fake's): prompt 210; candidates 33 + thoughts 11.
    assert {(c["input_tokens"], c["output_tokens"]) for c in calls} == {(210, 44)}

    # The tool call: asked for in one call, its result sent back in the next.
    tools = sql(
        store,
        "SELECT name, arguments, requested_in, answered_in, output, is_error FROM tool_calls "
        f"WHERE run_id = '{run_id}'",
    )
    assert len(tools) == 1
    (t,) = tools
    assert t["name"] == "write_file" and json.loads(t["arguments"]) == script[0]["args"]
    ids = [c["call_id"] for c in calls]
    assert t["answered_in"] is not None and ids.index(t["requested_in"]) < ids.index(t["answered_in"])
    assert "Successfully" in t["output"] and str(target) in t["output"]
    # The file write is recorded where the shim would see it too: the submission.
    sealed = sql(
        store,
        "SELECT payload->>'$.files[0].path' AS path FROM events "
        f"WHERE run_id = '{run_id}' AND kind = 'submission.sealed'",
    )
    assert sealed == [{"path": "hello.txt"}]
    assert_no_key_bytes(store)
    assert amb(store, "verify").returncode == 0

    # Replayed from the same folder and home: the CLI writes the file again with nothing upstream.
    # Its own call ids carry the time (write_file_<ms>_0), so a request differs from the recorded
    # one only there, which lenient matching masks: every call is served by its masked body.
    target.unlink()
    shutil.rmtree(home)
    shutil.copytree(tmp_path / "home-before", home)
    again = record("--replay", run_id, "--replay-match", "lenient")
    assert again.returncode == 0, again.stderr[-3000:]
    assert target.read_text() == CONTENT
    n = len(calls)
    assert f"(lenient): {n} of {n} recorded calls served, 0 unmatched request(s)" in again.stderr
    assert again.stderr.count("(lenient)\n") == n  # each by its masked body, none only the closest
