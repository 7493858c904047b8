"""Replay: a recorded run's model calls served back (``amb replay serve``, ``amb-record --replay``).

- The newest openai and anthropic SDKs (from .venv-agents), recorded against the loopback fake
  upstream, then run unchanged against the replay under ``strict``: every call (Chat Completions,
  Responses, Messages; streaming and not) is served byte-matched, the agent receives what it
  received the first time, and the new run is labelled a replay and diffs empty against the first.
- The demo's baseline agent replayed with ``amb-record --replay``: every model call served and the
  same submission, byte for byte.
- A client that lists the models before calling gets the recorded model under ``--replay``.
- Recorded failures come back as failures (an HTTP 500 with its body, a stream cut short), and a
  request that matches nothing gets a clear error in the API's shape, naming what was expected.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay.replayer import recorded
from replay.replayer.server import ReplayServer, open_replayer
from replay.store import Store
from replay.web import diff as diffs
from tests.fakes.agents import agents_python
from tests.fakes.harness import REAL_KEYS
from tests.fakes.upstream import FakeUpstream

AGENTS = Path(__file__).parents[1] / "fakes" / "agents"
BIN = Path(sys.executable).parent

# An agent with nothing but the standard library: a call that fails with a 500, a stream that the
# upstream cuts after two chunks, then a normal call. It writes what it got to got.json.
FAILING_AGENT = r"""
import json, os, urllib.request, urllib.error
base = os.environ["OPENAI_BASE_URL"].rstrip("/")
got = []
def post(body, headers):
    auth = "Bearer " + os.environ["OPENAI_API_KEY"]
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": auth, **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            try:
                got.append([r.status, r.read().decode()])
            except Exception as e:
                got.append([r.status, "cut: " + type(e).__name__])
    except urllib.error.HTTPError as e:
        got.append([e.code, e.read().decode()])
msgs = [{"role": "user", "content": "hi"}]
post({"model": "m", "messages": msgs}, {"x-fake-status": "500"})
post({"model": "m", "messages": msgs, "stream": True}, {"x-fake-reset-after": "2", "x-fake-chunks": "6"})
post({"model": "m", "messages": msgs + [{"role": "user", "content": "again"}]}, {})
post({"model": "m", "messages": msgs, "stream": True}, {"x-fake-delay-ms": "150", "x-fake-chunks": "4"})
json.dump(got, open("got.json", "w"))
"""


@pytest.fixture(scope="module")
def fake():
    with FakeUpstream() as f:
        yield f


def record(store: Path, ws: Path, argv: list[str], *extra: str, upstream: str | None = None):
    ws.mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "amb-record"), "--store", str(store)]
    if upstream:
        cmd += ["--upstream", f"openai={upstream}", "--upstream", f"anthropic={upstream}"]
    proc = subprocess.run(
        [*cmd, *extra, "--", *argv],
        cwd=ws,
        env={**os.environ, **REAL_KEYS},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else None


def labels_of(store: Path, run_id: str) -> dict:
    with Store.open(store, read_only=True) as st:
        return json.loads(
            st.con.execute("SELECT labels FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
        )


def test_newest_sdks_replay_unchanged_under_strict(tmp_path, fake):
    py = agents_python()
    store = tmp_path / "store"
    first, run_a = record(
        store, tmp_path / "ws-a", [str(py), str(AGENTS / "sdk_agent.py")], upstream=fake.url
    )
    assert first.returncode == 0, first.stderr
    n_upstream = len(fake.requests)
    again, run_b = record(
        store,
        tmp_path / "ws-b",
        [str(py), str(AGENTS / "sdk_agent.py")],
        "--replay",
        run_a,
        "--replay-match",
        "strict",
    )
    assert again.returncode == 0, again.stderr
    assert f"replay of {run_a} (strict): 8 of 8 recorded calls served, 0 unmatched request(s)" in again.stderr
    assert len(fake.requests) == n_upstream  # nothing reached the provider
    got_a = json.loads((tmp_path / "ws-a" / "client.json").read_text())
    got_b = json.loads((tmp_path / "ws-b" / "client.json").read_text())
    assert int(got_b["openai"].split(".")[0]) >= 3
    assert got_b["calls"] == got_a["calls"]  # text and tool calls, streamed and not, all three APIs
    assert labels_of(store, run_b) == {"replay_of": run_a, "replay_match": "strict"}
    with Store.open(store, read_only=True) as st:
        a, b = diffs.load_steps(st.con, run_a), diffs.load_steps(st.con, run_b)
        streamed = st.con.execute(
            "SELECT count(*) FILTER (WHERE stream), count(*) FROM model_calls WHERE run_id = ?", [run_b]
        ).fetchall()[0]
    rows = diffs.align(a, b)
    assert diffs.summarize(rows, a, b).identical and len(rows) == 8
    assert 0 < streamed[0] < streamed[1]  # both kinds went through the replay


def sealed_files(store: Path, run_id: str) -> dict[str, str]:
    with Store.open(store, read_only=True) as st:
        files = st.con.execute(
            "SELECT CAST(payload->'$.files' AS VARCHAR) FROM events "
            "WHERE run_id = ? AND kind = 'submission.sealed'",
            [run_id],
        ).fetchall()[0][0]
    return {f["path"]: f["sha256"] for f in json.loads(files)}


def test_baseline_replay_reproduces_every_call_and_the_submission(viewer_store, tmp_path):
    """The demo's baseline agent, replayed in its own workspace: the same calls, the same files."""
    # A copy of the session's store: the other tests count its runs.
    store, ws = tmp_path / "store", viewer_store.workspace / "clean"
    shutil.copytree(viewer_store.root, store)
    files_a = sealed_files(store, viewer_store.clean)
    with Store.open(store, read_only=True) as st:
        n_calls = st.con.execute(
            "SELECT count(*) FROM model_calls WHERE run_id = ?", [viewer_store.clean]
        ).fetchall()[0][0]
    brief = (ws / "tier_prompt.txt").read_bytes()
    shutil.rmtree(ws)
    ws.mkdir()
    (ws / "tier_prompt.txt").write_bytes(brief)
    # Strict: every request byte for byte. The baseline's tool results carry no wall time (no
    # ``elapsed_s``, no ``ls -l`` dates, no timings or free disk space printed), so they can.
    proc, run_b = record(
        store,
        ws,
        [
            str(BIN / "amb-agent"),
            "--model",
            "baseline",
            "--task-dir",
            ".",
            "--data",
            str(viewer_store.twin / "public"),
            "--retry-delay",
            "0.2",
        ],
        "--task",
        "bccd-det",
        "--tier",
        "lite",
        "--data",
        str(viewer_store.twin),
        "--replay",
        viewer_store.clean,
        "--replay-match",
        "strict",
    )
    assert proc.returncode == 0, proc.stderr
    assert f"(strict): {n_calls} of {n_calls} recorded calls served, 0 unmatched request(s)" in proc.stderr
    with Store.open(store, read_only=True) as st:
        a, b = diffs.load_steps(st.con, viewer_store.clean), diffs.load_steps(st.con, run_b)
    files_b = sealed_files(store, run_b)
    assert any(p.startswith("agents_outputs/") for p in files_a)
    assert files_b == files_a  # the same submission: every sealed file, byte for byte
    assert diffs.summarize(diffs.align(a, b), a, b).identical  # the same tool calls, in order


def test_failures_are_replayed_as_failures_and_misses_are_explained(tmp_path, fake):
    store = tmp_path / "store"
    proc, run_a = record(store, tmp_path / "ws-a", [sys.executable, "-c", FAILING_AGENT], upstream=fake.url)
    assert proc.returncode == 0, proc.stderr
    got_a = json.loads((tmp_path / "ws-a" / "got.json").read_text())
    assert got_a[0][0] == 500 and got_a[1][1].startswith("cut:") and got_a[2][0] == 200 == got_a[3][0]
    again, _ = record(store, tmp_path / "ws-b", [sys.executable, "-c", FAILING_AGENT], "--replay", run_a)
    assert again.returncode == 0, again.stderr
    got_b = json.loads((tmp_path / "ws-b" / "got.json").read_text())
    assert got_b[0] == got_a[0]  # the same 500 and its body
    assert got_b[1][1].startswith("cut:")  # the stream is cut again
    assert got_b[2:] == got_a[2:]
    assert "4 of 4 recorded calls served, 0 unmatched" in again.stderr

    # A request that matches nothing: a 400 in the API's shape, naming the call that was expected.
    reported: list[str] = []
    replayer = open_replayer(store, run_a, "strict", "fast", reported.append)
    with ReplayServer(replayer) as server:
        con = http.client.HTTPConnection("127.0.0.1", server.server.server_port, timeout=30)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "something else"}]})
        con.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json"})
        r = con.getresponse()
        err = json.loads(r.read())
        assert r.status == 400 and err["error"]["code"] == "replay_miss"
        assert "proxy:" in err["error"]["message"] and "messages[0] differs" in err["error"]["message"]
        con.request("POST", "/v1/messages", body=b"{}", headers={"content-type": "application/json"})
        r = con.getresponse()
        miss = json.loads(r.read())
        assert r.status == 400 and miss["type"] == "error" and miss["error"]["type"] == "replay_miss"
    assert len(replayer.matcher.summary()["misses"]) == 2 and "no match" in reported[0]


# An agent that lists the models (as some clients do before their first call), then calls one.
LISTING_AGENT = r"""
import json, os, urllib.request
base = os.environ["OPENAI_BASE_URL"].rstrip("/")
auth = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"}
got = {}
try:
    with urllib.request.urlopen(urllib.request.Request(base + "/models", headers=auth), timeout=30) as r:
        got["models"] = [m["id"] for m in json.loads(r.read())["data"]]
except Exception as e:
    got["models"] = type(e).__name__
body = json.dumps({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}).encode()
req = urllib.request.Request(base + "/chat/completions", data=body, headers=auth)
with urllib.request.urlopen(req, timeout=30) as r:
    got["status"] = r.status
json.dump(got, open("got.json", "w"))
"""


def test_a_client_that_lists_the_models_first_is_answered_under_replay(tmp_path, fake):
    """Under ``amb-record --replay``, ``GET /v1/models`` goes through the proxy to the replay
    endpoint and lists the model the recording called; the call that follows is served."""
    store = tmp_path / "store"
    proc, run_a = record(store, tmp_path / "ws-a", [sys.executable, "-c", LISTING_AGENT], upstream=fake.url)
    assert proc.returncode == 0, proc.stderr
    again, _ = record(store, tmp_path / "ws-b", [sys.executable, "-c", LISTING_AGENT], "--replay", run_a)
    assert again.returncode == 0, again.stderr
    got = json.loads((tmp_path / "ws-b" / "got.json").read_text())
    assert got == {"models": ["gpt-x"], "status": 200}
    assert "1 of 1 recorded calls served, 0 unmatched" in again.stderr


def test_original_timing_paces_a_stream_as_recorded(tmp_path, fake):
    store = tmp_path / "store"
    proc, run_a = record(store, tmp_path / "ws", [sys.executable, "-c", FAILING_AGENT], upstream=fake.url)
    assert proc.returncode == 0, proc.stderr
    for timing in ("original", "fast"):
        replayer = open_replayer(store, run_a, "sequence", timing)
        assert replayer.models == {"m": "openai"}  # what GET /v1/models lists
        paced = replayer.matcher.calls[3]
        assert paced.latency_ms is not None and paced.ttfb_ms is not None and paced.response_blob is not None
        assert paced.stream and paced.latency_ms > 400  # the fake upstream spaced its chunks 150 ms apart
        for call in replayer.matcher.calls[:3]:
            replayer.matcher.served[call.index] = True
        with ReplayServer(replayer) as server:
            con = http.client.HTTPConnection("127.0.0.1", server.server.server_port, timeout=30)
            t0 = time.perf_counter()
            con.request(
                "POST", "/v1/chat/completions", body=paced.body, headers={"content-type": "application/json"}
            )
            r = con.getresponse()
            first = r.read1(64)
            t_first = time.perf_counter() - t0
            rest = r.read()
            total = time.perf_counter() - t0
        assert (first + rest) == replayer.blobs.get(paced.response_blob)  # the recorded bytes, in order
        if timing == "original":
            assert t_first >= 0.9 * paced.ttfb_ms / 1000 and total >= 0.9 * paced.latency_ms / 1000
        else:
            assert total < 0.9 * paced.latency_ms / 1000


def test_a_google_genai_run_replays_unchanged_under_strict(tmp_path, genai_run, monkeypatch):
    """The Gemini API served back: generateContent and streamGenerateContent (SSE, and the JSON
    array of a raw HTTP client), countTokens, a function call answered in the next request. Every
    request is the recorded one byte for byte, the agent receives what it received, and the
    replayed run's submission is the original's."""
    store = tmp_path / "store"
    shutil.copytree(genai_run.store, store)
    n_upstream = len(genai_run.fake.requests)
    monkeypatch.setenv("GENAI_KEY_OUT", str(tmp_path / "key"))
    again, run_b = record(
        store,
        tmp_path / "ws",
        [str(agents_python()), str(AGENTS / "genai_agent.py")],
        "--replay",
        genai_run.run_id,
        "--replay-match",
        "strict",
    )
    assert again.returncode == 0, again.stderr
    assert "(strict): 7 of 7 recorded calls served, 0 unmatched request(s)" in again.stderr
    assert len(genai_run.fake.requests) == n_upstream  # nothing reached the provider
    assert json.loads((tmp_path / "ws" / "client.json").read_text()) == genai_run.client
    original = sealed_files(store, genai_run.run_id)
    assert "client.json" in original and sealed_files(store, run_b) == original
    assert labels_of(store, run_b) == {"replay_of": genai_run.run_id, "replay_match": "strict"}
    with Store.open(store, read_only=True) as st:
        apis = st.con.execute(
            "SELECT api, stream FROM model_calls WHERE run_id = ? ORDER BY seq", [run_b]
        ).fetchall()
    assert {a for a, _ in apis} == {"generateContent", "streamGenerateContent", "countTokens"}
    assert any(s for _, s in apis) and not all(s for _, s in apis)


def test_gemini_streams_are_sent_again_byte_for_byte(genai_run):
    """Each recorded Gemini stream (SSE with CRLF line ends, and the JSON array) comes back with its
    bytes and media type as recorded, and a whole response as a whole one."""
    replayer = open_replayer(genai_run.store, genai_run.run_id, "sequence", "fast")
    with Store.open(genai_run.store, read_only=True) as st:
        urls = dict(
            st.con.execute(
                "SELECT e.payload->>'$.call_id', e.payload->>'$.url' FROM events e "
                "WHERE e.run_id = ? AND e.kind = 'model_call.completed'",
                [genai_run.run_id],
            ).fetchall()
        )
    seen = set()
    with ReplayServer(replayer) as server:
        con = http.client.HTTPConnection("127.0.0.1", server.server.server_port, timeout=30)
        for call in replayer.matcher.calls:
            path = "/" + urls[call.call_id].split("/", 3)[3].removeprefix("google/")
            con.request("POST", path, body=call.body, headers={"content-type": "application/json"})
            r = con.getresponse()
            got = r.read()
            assert call.response_blob is not None
            assert r.status == call.status and got == replayer.blobs.get(call.response_blob)
            assert r.getheader("content-type") == call.response_media
            seen.add((call.api, call.response_media, r.getheader("transfer-encoding")))
    assert ("streamGenerateContent", "text/event-stream", "chunked") in seen
    assert ("streamGenerateContent", "application/json", "chunked") in seen
    assert ("generateContent", "application/json", None) in seen


def test_a_gemini_request_is_compared_item_by_item():
    """The lenient matcher and the miss message look into a Gemini body's ``contents`` as they do
    into ``messages`` and ``input``: a request that differs in its last turn is close, and the
    miss names that turn."""
    turn = [{"role": "user", "parts": [{"text": f"step {i}"}]} for i in range(3)]
    a = json.dumps({"contents": turn, "generationConfig": {"temperature": 0}})
    b = json.dumps(
        {
            "contents": turn[:2] + [{"role": "user", "parts": [{"text": "other"}]}],
            "generationConfig": {"temperature": 0},
        }
    )
    assert recorded.similarity(a, b) == pytest.approx(2 / 3)
    assert recorded.first_difference(a.encode(), b.encode()) == "contents[2] differs"
