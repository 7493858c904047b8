"""``amb-record`` end to end, as a user runs it: real agents (the openai 3.x and anthropic SDKs from
their own venv, openai 2.x from the project's, curl, node's fetch) against the loopback fake
upstream; then ``amb verify`` and the SQL views over the ingested store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay.spools import read_bytes as read_spool
from schemas.blobstore import BlobStore
from tests.fakes.agents import agents_python, undici_dir
from tests.fakes.blob_contents import blob_contents
from tests.fakes.harness import REAL_KEYS
from tests.fakes.record_cli import amb_record
from tests.fakes.upstream import TEXT, TOOL_ARGS, FakeUpstream

AGENTS = Path(__file__).parents[1] / "fakes" / "agents"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def tls_fake(tmp_path_factory):
    with FakeUpstream(tls_dir=tmp_path_factory.mktemp("tls"), host="127.0.0.2") as f:
        yield f


@pytest.fixture(scope="session")
def agents_py():
    return agents_python()


def record_python(store: Path, fake_url: str, python: Path, code: str) -> list[str]:
    """``amb-record`` running ``python -c code`` against the fake provider (openai)."""
    recorder = [str(BIN / "amb-record"), "--store", str(store), "--upstream", f"openai={fake_url}"]
    return [*recorder, "--", str(python), "-c", code]


def start(cmd: list[str], ws: Path) -> subprocess.Popen[str]:
    """Start ``cmd`` in ``ws`` with the real keys in its environment, its output captured."""
    env = {**os.environ, **REAL_KEYS}
    return subprocess.Popen(cmd, cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def amb(store: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "amb"), *args, "--store", str(store)], capture_output=True, text=True, timeout=120
    )


def sql(store: Path, query: str) -> list[dict]:
    r = amb(store, "sql", query, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def run_id_of(result: subprocess.CompletedProcess) -> str:
    return result.stdout.strip().splitlines()[-1]


def assert_no_key_bytes(store: Path) -> None:
    keys = [k.encode() for k in REAL_KEYS.values()]
    for path in store.rglob("*"):
        if not path.is_file():
            continue
        # Blob packs hold compressed records (searched decompressed below); spools compressed after
        # ingest are searched decompressed (replay.spools).
        data = read_spool(path) if path.name.endswith(".spool.zst") else path.read_bytes()
        assert not any(k in data for k in keys), path
    for where, data in blob_contents(store / "blobs"):  # (a chunk list holds addresses only)
        assert not any(k in data for k in keys), where
    hits = sql(
        store,
        "SELECT count(*) AS n FROM events WHERE "
        + " OR ".join(f"payload::VARCHAR LIKE '%{k}%'" for k in REAL_KEYS.values()),
    )
    assert hits == [{"n": 0}]


@pytest.mark.parametrize("which", ["openai3-venv", "openai2-project"])
def test_sdk_agent_is_fully_recorded(tmp_path, fake, agents_py, which):
    python = agents_py if which == "openai3-venv" else sys.executable
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    n_before = len(fake.requests)
    res = amb_record(
        store,
        fake.url,
        [str(python), str(AGENTS / "sdk_agent.py")],
        cwd=ws,
        extra=["--label", "sdk=" + which, "--task", "demo", "--tier", "lite"],
    )
    assert res.returncode == 0, res.stderr
    run_id = run_id_of(res)
    assert f"run {run_id}: completed, exit code 0, 8 model calls" in res.stderr
    client = json.loads((ws / "client.json").read_text())
    assert client["openai"].startswith("3." if which == "openai3-venv" else "2.")

    # Credential custody: the agent held placeholders; the upstream got the real keys.
    assert all(k.startswith("amb-placeholder-") for k in client["keys"])
    seen = fake.requests[n_before:]
    assert len(seen) == 8
    for req in seen:
        key = REAL_KEYS["ANTHROPIC_API_KEY" if req.path.endswith("/messages") else "OPENAI_API_KEY"]
        # (anthropic 2.x sends the key as a bearer token, 0.x as x-api-key: custody handles both)
        assert key in (
            req.headers.get("x-api-key"),
            req.headers.get("authorization", "").removeprefix("Bearer "),
        )
    assert_no_key_bytes(store)

    # Ingested at the end, verifiable, and every call's content equals what the client received.
    verify = amb(store, "verify")
    assert verify.returncode == 0 and verify.stdout.startswith("OK"), verify.stdout + verify.stderr
    rows = sql(
        store,
        f"SELECT api, stream, ok, text, call_id FROM model_calls WHERE run_id = '{run_id}' ORDER BY seq",
    )
    assert [(r["api"], r["ok"]) for r in rows] == [(c["api"], True) for c in client["calls"]]
    assert [r["text"] for r in rows] == [c["text"] for c in client["calls"]] == [TEXT] * 8
    assert [r["stream"] for r in rows] == [False, False, True, False, True, False, True, False]

    # Tool calls: every one the client got is recorded with its raw arguments; answered ones are paired.
    tools = sql(
        store,
        f"SELECT tool_call_id, arguments, answered_in, output FROM tool_calls WHERE run_id = '{run_id}'",
    )
    by_id = {t["tool_call_id"]: t for t in tools}
    client_tools = [t for c in client["calls"] for t in c["tools"]]
    assert sorted(by_id) == sorted(t[0] for t in client_tools)
    for tid, args in client_tools:
        assert json.loads(by_id[tid]["arguments"]) == json.loads(args) == TOOL_ARGS
    chat_tool, ant_tool = client["calls"][0]["tools"][0][0], client["calls"][5]["tools"][0][0]
    assert by_id[chat_tool]["output"] == "notes: ok" and by_id[chat_tool]["answered_in"] == rows[1]["call_id"]
    assert by_id[ant_tool]["output"] == "42" and by_id[ant_tool]["answered_in"] == rows[7]["call_id"]
    assert sum(t["answered_in"] is not None for t in tools) == 2  # history resent in turn 3 counted once

    # "Calls, tokens and tool calls per run" from the views.
    (per_run,) = sql(
        store,
        """
        SELECT r.run_id, r.status, r.task, count(m.call_id) AS calls, sum(m.input_tokens) AS input_tokens,
               sum(m.output_tokens) AS output_tokens, any_value(r.n_tool_calls) AS tool_calls
        FROM runs r JOIN model_calls m USING (run_id) GROUP BY ALL""",
    )
    assert per_run == {
        "run_id": run_id,
        "status": "completed",
        "task": "demo",
        "calls": 8,
        "input_tokens": 3 * 120 + 2 * 200 + 3 * 500,
        "output_tokens": 3 * 30 + 2 * 40 + 3 * 25,
        "tool_calls": len(client_tools),
    }


def test_curl_records_bytes_as_received(tmp_path, fake):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    script = (
        f'curl -sS -N "$OPENAI_BASE_URL/chat/completions" -H "authorization: Bearer $OPENAI_API_KEY" '
        f"-H 'content-type: application/json' -d '{body}' -o plain.out && "
        f"curl -sS -N --compressed -H 'x-fake-encoding: gzip' \"$OPENAI_BASE_URL/chat/completions\" "
        f"-H \"authorization: Bearer $OPENAI_API_KEY\" -H 'content-type: application/json' -d '{body}' "
        "-o gzip.out"
    )
    res = amb_record(store, fake.url, ["sh", "-c", script], cwd=ws)
    assert res.returncode == 0, res.stderr
    rows = sql(store, "SELECT response_blob, ok, text FROM model_calls ORDER BY seq")
    blobs = BlobStore(store / "blobs")
    assert [blobs.get(r["response_blob"]) for r in rows] == [
        (ws / "plain.out").read_bytes(),
        (ws / "gzip.out").read_bytes(),
    ]
    assert all(r["ok"] and r["text"] == TEXT for r in rows)


def test_agent_and_model_as_the_user_named_them(tmp_path, fake):
    # The name and model shown by `amb runs` and `amb show` are the given ones; the binary stays in
    # the recorded command. Without --agent the command's basename is the name, as before.
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    named = amb_record(
        store,
        fake.url,
        [sys.executable, "-c", "pass"],
        cwd=ws,
        extra=["--agent", "my-agent", "--model", "m-1"],
    )
    plain = amb_record(store, fake.url, [sys.executable, "-c", "pass"], cwd=ws)
    assert named.returncode == plain.returncode == 0, named.stderr + plain.stderr
    shown = json.loads(amb(store, "show", run_id_of(named), "--json").stdout)
    assert (shown["agent"], shown["model"]) == ("my-agent", "m-1")
    runs = {r["run_id"]: r for r in json.loads(amb(store, "runs", "--json").stdout)}
    assert (runs[run_id_of(named)]["agent"], runs[run_id_of(named)]["model"]) == ("my-agent", "m-1")
    assert (runs[run_id_of(plain)]["agent"], runs[run_id_of(plain)]["model"]) == (
        Path(sys.executable).name,
        None,
    )
    started = sql(
        store,
        f"SELECT payload->>'$.command[0]' AS bin FROM events WHERE kind = 'run.started' "
        f"AND run_id = '{run_id_of(named)}'",
    )
    assert started == [{"bin": sys.executable}]


def test_https_through_the_regular_proxy_curl_and_node(tmp_path, tls_fake):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    node_modules = undici_dir() / "node_modules"
    url = tls_fake.url + "/v1/chat/completions"
    script = (
        f"curl -sS {tls_fake.url}/bytes/777 -o curl.out && "
        f"curl -sS {url} -H \"authorization: Bearer $OPENAI_API_KEY\" -H 'content-type: application/json' "
        '-d \'{"model": "m", "messages": []}\' -o curl-chat.out && '
        f'curl -sS --http2 {url} -H "authorization: Bearer $OPENAI_API_KEY" -H \'content-type: '
        "application/json' "
        '-d \'{"model": "h2", "stream": true, "messages": []}\' -o h2.out -w \'%{http_version}\' > '
        "h2.version && "
        f"node {AGENTS / 'fetch_agent.cjs'} {url} node.json"
    )
    # The TLS fake is also the openai upstream: in regular mode the key goes only to that host.
    res = amb_record(
        store,
        tls_fake.url,
        ["sh", "-c", script],
        cwd=ws,
        env={"AMB_UPSTREAM_CA": str(tls_fake.ca_file), "UNDICI": str(node_modules / "undici")},
    )
    assert res.returncode == 0, res.stderr + res.stdout
    assert (ws / "curl.out").read_bytes() == b"x" * 777
    node = json.loads((ws / "node.json").read_text())
    assert node["status"] == 200 and node["bytes"] == 4096 and "[DONE]" in node["body"]
    assert (ws / "h2.version").read_text() == "2"  # an HTTP/2 client (the upstream speaks HTTP/1.1)
    calls = sql(store, "SELECT model, ok, stream, text FROM model_calls ORDER BY seq")
    assert calls == [
        {"model": "m", "ok": True, "stream": False, "text": TEXT},
        {"model": "h2", "ok": True, "stream": True, "text": TEXT},
        {"model": "gpt-node", "ok": True, "stream": True, "text": TEXT},
    ]
    nets = sql(store, "SELECT scheme, host, path, status, response_bytes FROM network_requests ORDER BY seq")
    assert nets == [
        {"scheme": "https", "host": "127.0.0.2", "path": "/bytes/777", "status": 200, "response_bytes": 777},
        {
            "scheme": "https",
            "host": "127.0.0.2",
            "path": "/bytes/4096",
            "status": 200,
            "response_bytes": 4096,
        },
    ]
    assert all(
        r.headers.get("authorization") == "Bearer " + REAL_KEYS["OPENAI_API_KEY"]
        for r in tls_fake.requests
        if r.path.startswith("/v1/")
    )
    assert_no_key_bytes(store)


def test_sigterm_is_forwarded_and_the_exit_code_propagates(tmp_path, fake):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    agent = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(42)); "
        "open('ready', 'w').close(); time.sleep(60)"
    )
    cmd = [str(BIN / "amb-record"), "--store", str(store), "--", sys.executable, "-c", agent]
    p = start(cmd, ws)
    deadline = time.monotonic() + 30
    while not (ws / "ready").exists():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 42, err
    (run,) = sql(store, "SELECT status, exit_code FROM runs")
    assert run == {"status": "killed", "exit_code": 42}


def test_time_limit_exit_code_124(tmp_path, fake):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    res = amb_record(store, fake.url, ["sleep", "30"], cwd=ws, extra=["--time-limit", "0.5"])
    assert res.returncode == 124 and "timeout" in res.stderr
    assert sql(store, "SELECT status, exit_code FROM runs") == [{"status": "timeout", "exit_code": 124}]


def test_recorder_killed_with_sigkill_leaves_a_recoverable_spool(tmp_path, fake, agents_py):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    agent = (
        "import openai, time; c = openai.OpenAI(max_retries=0); "
        "c.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}]); "
        "open('called', 'w').close(); time.sleep(60)"
    )
    cmd = record_python(store, fake.url, agents_py, agent)
    p = subprocess.Popen(
        cmd, cwd=ws, env={**os.environ, **REAL_KEYS}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not (ws / "called").exists():
        assert p.stderr is not None
        assert time.monotonic() < deadline and p.poll() is None, (
            p.stderr.read() if p.poll() is not None else ""
        )
        time.sleep(0.05)
    p.kill()
    p.wait(10)
    assert not (store / "amb.duckdb").exists() or sql(store, "SELECT count(*) AS n FROM events") == [{"n": 0}]
    ing = amb(store, "ingest")
    assert ing.returncode == 0, ing.stderr
    assert sql(store, "SELECT status FROM runs") == [{"status": "unfinished"}]
    assert sql(store, "SELECT ok, text FROM model_calls") == [{"ok": True, "text": TEXT}]
    assert amb(store, "verify").returncode == 0


def test_concurrent_runs_share_one_store(tmp_path, fake, agents_py):
    store = tmp_path / "store"
    agent = (
        "import openai; c = openai.OpenAI(max_retries=0)\n"
        "for i in range(3): c.chat.completions.create(model='m', messages=[{'role': 'user', 'content': "
        "str(i)}])"
    )
    procs = []
    for i in range(3):
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        cmd = record_python(store, fake.url, agents_py, agent)
        procs.append(start(cmd, ws))
    ids = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        ids.append(out.strip().splitlines()[-1])
    rows = sql(store, "SELECT run_id, n_model_calls, status FROM runs ORDER BY run_id")
    assert rows == [{"run_id": r, "n_model_calls": 3, "status": "completed"} for r in sorted(ids)]
    assert amb(store, "verify").returncode == 0


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "no command given"),
        (["--upstream", "mistral=http://x", "--", "true"], "'mistral' is not a kind"),
        (["--upstream", "openai=http://x/v1?k=1", "--", "true"], "no query, fragment or credentials"),
        (["--upstream", "helper=nokind:http://x", "--", "true"], "unknown kind 'nokind'"),
        (["--label", "novalue", "--", "true"], "expected K=V"),
        (["--time-limit", "-1", "--", "true"], "--time-limit -1.0: must be a positive"),
        (["--time-limit", "nan", "--", "true"], "--time-limit nan: must be a positive"),
        (["--max-cost", "inf", "--", "true"], "--max-cost inf: must be a finite"),
        (["--run-id", "../x", "--replay", "r", "--", "true"], "'../x' is not a run id"),
        (["--upstream", "openai=http://[::1:1/v1", "--", "true"], "not a URL (Invalid IPv6 URL)"),
        (["--label", "a=1", "--label", "a=2", "--", "true"], "--label 'a=2': 'a' is given twice"),
        (["--run-id", "r1", "--label", b"k=a\xff", "--", "true"], "--label 'k=a\\udcff': not UTF-8 text"),
        (["--model", b"m\xfe", "--", "true"], "--model 'm\\udcfe': not UTF-8 text"),
        (["--tier", "x", "--", "true"], "Invalid value for '--tier'"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    r = subprocess.run(
        [str(BIN / "amb-record"), "--store", str(tmp_path / "s"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was made: no spool claims the id
