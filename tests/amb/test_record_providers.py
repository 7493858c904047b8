"""``amb-record`` with the newest SDKs against every kind of endpoint the benchmark's models are
served from, each a loopback fake that speaks its wire format under its own path prefix: the
google-genai SDK (Gemini API, streaming and not, function calling, countTokens, an image), the openai
SDK on an OpenRouter-style gateway (a named upstream) and on Azure (deployment and v1 paths), and the
anthropic SDK behind a prefix. Each must give the right model calls, tool calls and usage, the real
keys only upstream, and no key in the store."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replay.ingest import spool_files
from replay.spools import read_bytes as read_spool
from schemas.blob import BlobRef
from schemas.blobstore import BlobStore
from tests.amb.test_record_cli import amb, assert_no_key_bytes, run_id_of, sql
from tests.fakes.agents import agents_python
from tests.fakes.harness import REAL_KEYS
from tests.fakes.upstream import GEMINI_THOUGHT, SERVED_MODEL, TEXT, TOOL_ARGS, FakeUpstream

AGENTS = Path(__file__).parents[1] / "fakes" / "agents"
BIN = Path(sys.executable).parent
GATEWAY_KEYS = {
    "OPENROUTER_API_KEY": "sk-or-v1-test-REAL-0a1b2c3d",
    "AZURE_OPENAI_API_KEY": "azure-test-REAL-4e5f6a7b",
}


@pytest.fixture(scope="session")
def agents_py():
    return agents_python()


EXTRA = (
    "e.payload->>'$.message.reasoning' AS reasoning, e.payload->'$.message.tool_calls' AS tools, "
    "e.payload->>'$.url' AS url FROM model_calls m JOIN events e ON e.run_id = m.run_id AND "
    "e.source = 'proxy' AND e.seq = m.seq ORDER BY m.seq"
)
"""Payload fields the view leaves out, for ``SELECT m.col, ..., `` + EXTRA."""


def record(store: Path, ws: Path, upstreams: list[str], argv: list[str], env: dict[str, str]):
    cmd = [str(BIN / "amb-record"), "--store", str(store)]
    for up in upstreams:
        cmd += ["--upstream", up]
    return subprocess.run(
        [*cmd, "--", *argv],
        cwd=ws,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_google_genai_sdk_is_fully_recorded(tmp_path, agents_py):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    with FakeUpstream(prefix="/google") as fake:
        res = record(
            store,
            ws,
            [f"gemini={fake.url}/google"],
            [str(agents_py), str(AGENTS / "genai_agent.py")],
            REAL_KEYS,
        )
        seen = list(fake.requests)
    assert res.returncode == 0, res.stderr
    run_id = run_id_of(res)
    assert f"run {run_id}: completed, exit code 0, 7 model calls" in res.stderr
    client = json.loads((ws / "client.json").read_text())
    assert client["key"].startswith("amb-placeholder-gemini-")
    # The agent's /v1beta/... went under the upstream's /google prefix, with the real key in the
    # header or the query, as the client sent it.
    assert len(seen) == 7 and all(s.path.startswith("/google/v1") for s in seen)
    real = REAL_KEYS["GEMINI_API_KEY"]
    for s in seen:
        assert s.headers.get("x-goog-api-key") == real or s.path.endswith(f"?key={real}")
    assert_no_key_bytes(store)
    assert amb(store, "verify").returncode == 0

    rows = sql(
        store,
        "SELECT m.call_id, m.provider, m.api, m.requested_model, m.served_model, m.upstream, m.stream, m.ok, "
        "m.text, m.input_tokens, m.cache_read_tokens, m.output_tokens, m.reasoning_tokens, m.usage_reported, "
        "m.request_blob, " + EXTRA,
    )
    assert [r["api"] for r in rows] == [c["api"] for c in client["calls"]]
    assert {(r["provider"], r["upstream"], r["requested_model"], r["ok"]) for r in rows} == {
        ("gemini", "gemini", "gemini-test", True)
    }
    for row, got in zip(rows, client["calls"], strict=True):
        if row["api"] == "countTokens":
            assert got["total"] == 42 and row["output_tokens"] == 0 and row["served_model"] is None
            continue
        assert row["served_model"] == "gemini-test-001" and row["stream"] == (row["api"] != "generateContent")
        assert row["text"] == got["text"] == TEXT and row["reasoning"] == GEMINI_THOUGHT
        tools = json.loads(row["tools"])
        assert [[t["name"], json.loads(t["arguments"])] for t in tools] == got["tools"]
        # usageMetadata by hand: prompt 210 (cached 150 inside); candidates 33 + thoughts 11.
        assert (
            row["input_tokens"],
            row["cache_read_tokens"],
            row["output_tokens"],
            row["reasoning_tokens"],
        ) == (
            210,
            150,
            44,
            11,
        )
        assert row["usage_reported"] is True
    assert rows[5]["url"].endswith("/google/v1beta/models/gemini-test:generateContent?key=[redacted]")
    assert rows[2]["url"].endswith(":streamGenerateContent?alt=sse")
    # The function call of the first turn is paired with the function response of the second; the
    # streamed one was never answered.
    pairs = sql(
        store, "SELECT name, arguments, requested_in, answered_in, output FROM tool_calls ORDER BY seq"
    )
    assert [(p["name"], json.loads(p["arguments"])) for p in pairs] == [("read_file", TOOL_ARGS)] * 2
    assert (pairs[0]["requested_in"], pairs[0]["answered_in"], pairs[0]["output"]) == (
        rows[0]["call_id"],
        rows[1]["call_id"],
        "notes: ok",
    )
    assert pairs[1]["requested_in"] == rows[2]["call_id"] and pairs[1]["answered_in"] is None
    # The inline image is in the request blob, as sent (the SDK uses the URL-safe alphabet).
    ref = BlobRef(blob=rows[4]["request_blob"], size=0)
    sent = json.loads(BlobStore(store / "blobs").get(ref))["contents"][0]["parts"][0]["inlineData"]["data"]
    assert hashlib.sha256(base64.urlsafe_b64decode(sent)).hexdigest() == client["image_sha256"]


def test_openai_sdk_on_gateways_and_anthropic_behind_a_prefix(tmp_path, agents_py):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    with (
        FakeUpstream(prefix="/api/v1", flavour="openrouter") as router,
        FakeUpstream(prefix="/openai") as azure,
        FakeUpstream(prefix="/anthropic") as claude,
    ):
        res = record(
            store,
            ws,
            [
                f"openrouter=openai:{router.url}/api/v1",
                f"azure={azure.url}",
                f"anthropic={claude.url}/anthropic",
            ],
            [str(agents_py), str(AGENTS / "gateway_agent.py")],
            {**REAL_KEYS, **GATEWAY_KEYS},
        )
        seen = {
            "router": list(router.requests),
            "azure": list(azure.requests),
            "claude": list(claude.requests),
        }
    assert res.returncode == 0, res.stderr
    run_id = run_id_of(res)
    assert f"run {run_id}: completed, exit code 0, 5 model calls" in res.stderr
    client = json.loads((ws / "client.json").read_text())
    assert client["openai"].startswith("3.") and all(k.startswith("amb-placeholder-") for k in client["keys"])

    # Paths: the SDKs' /v1/... under each upstream's prefix; Azure's own paths as they are.
    assert [s.path for s in seen["router"]] == ["/api/v1/chat/completions"] * 2
    assert [s.path for s in seen["azure"]] == [
        "/openai/deployments/my-gpt4o-deployment/chat/completions?api-version=2024-10-21",
        "/openai/v1/chat/completions",
    ]
    assert [s.path for s in seen["claude"]] == ["/anthropic/v1/messages"]
    # Keys: each upstream got its own real key, in the header its SDK uses.
    for s in seen["router"]:
        assert s.headers["authorization"] == "Bearer " + GATEWAY_KEYS["OPENROUTER_API_KEY"]
    assert seen["azure"][0].headers["api-key"] == GATEWAY_KEYS["AZURE_OPENAI_API_KEY"]
    assert seen["azure"][1].headers["authorization"] == "Bearer " + GATEWAY_KEYS["AZURE_OPENAI_API_KEY"]
    claude_key = seen["claude"][0].headers
    assert REAL_KEYS["ANTHROPIC_API_KEY"] in (
        claude_key.get("x-api-key"),
        claude_key.get("authorization", "")[7:],
    )
    keys = {**REAL_KEYS, **GATEWAY_KEYS}
    for path in spool_files(store):  # plain or compressed after ingest
        assert not any(k.encode() in read_spool(path) for k in keys.values())
    assert_no_key_bytes(store)
    hits = sql(
        store,
        "SELECT count(*) AS n FROM events WHERE "
        + " OR ".join(f"payload::VARCHAR LIKE '%{k}%'" for k in GATEWAY_KEYS.values()),
    )
    assert hits == [{"n": 0}]

    rows = sql(
        store,
        "SELECT m.call_id, m.provider, m.api, m.model, m.requested_model, m.served_model, m.upstream, "
        "m.text, "
        "m.input_tokens, m.cache_read_tokens, m.cache_write_tokens, m.output_tokens, m.reasoning_tokens, "
        "m.reported_cost_usd, " + EXTRA,
    )
    assert [(r["upstream"], r["provider"], r["api"]) for r in rows] == [
        ("openrouter", "openai", "chat.completions"),
        ("openrouter", "openai", "chat.completions"),
        ("azure", "openai", "chat.completions"),
        ("azure", "openai", "chat.completions"),
        ("anthropic", "anthropic", "messages"),
    ]
    recorded_ids = []
    for row, got in zip(rows, client["calls"], strict=True):
        assert row["text"] == got["text"] == TEXT
        tools = json.loads(row["tools"])
        assert [t["arguments"] for t in tools] == [a for _, a in got["tools"]]
        # Each fake numbers its calls from 1, so two upstreams send call_fake_1: a call keeps the
        # provider's id unless an earlier call of the run has it (tool call ids are the run's).
        for t, (client_id, _) in zip(tools, got["tools"], strict=True):
            assert t["id"] == client_id or t["id"].startswith(client_id + "~")
            recorded_ids.append(t["id"])
        assert row["served_model"] == got["model"]
    assert len(set(recorded_ids)) == len(recorded_ids) == 5
    assert sql(store, "SELECT count(*) AS n FROM tool_calls") == [{"n": 5}]
    for row in rows[:2]:  # OpenRouter: the model it served, reasoning, cached tokens, cost
        assert (row["requested_model"], row["served_model"], row["model"]) == (
            "openai/gpt-4o",
            SERVED_MODEL,
            SERVED_MODEL,
        )
        assert (row["input_tokens"], row["cache_read_tokens"], row["cache_write_tokens"]) == (120, 100, 5)
        assert (row["output_tokens"], row["reasoning_tokens"], row["reported_cost_usd"]) == (30, 7, 0.00123)
        assert row["reasoning"] == "Thinking it over."
        assert row["url"].startswith(router.url + "/api/v1/chat/completions")
    assert rows[0]["reasoning"] == client["calls"][0]["reasoning"]
    assert rows[2]["requested_model"] == "my-gpt4o-deployment" and rows[2]["reported_cost_usd"] is None
    assert rows[2]["url"] == (
        f"{azure.url}/openai/deployments/my-gpt4o-deployment/chat/completions?api-version=2024-10-21"
    )
    assert rows[4]["url"] == f"{claude.url}/anthropic/v1/messages"
    # Anthropic's cache counts are added to its input (the containment convention): 30 + 400 + 70.
    assert (rows[4]["input_tokens"], rows[4]["cache_read_tokens"], rows[4]["cache_write_tokens"]) == (
        500,
        400,
        70,
    )


def _paired_as_the_client_saw(store: Path, conversations: list[dict]) -> None:
    """Every conversation's call was recorded once and answered once, in its own conversation, with
    the output that conversation sent; every model call's tool calls are events of the store."""
    rows = sql(store, "SELECT call_id, n_tool_calls FROM model_calls ORDER BY seq")
    pairs = sql(
        store,
        "SELECT tool_call_id, arguments, requested_in, answered_in, output FROM tool_calls ORDER BY seq",
    )
    assert len(pairs) == len(conversations) == len({p["tool_call_id"] for p in pairs})
    asked = {r["call_id"]: r["n_tool_calls"] for r in rows}
    assert sum(asked.values()) == len(pairs)
    for p in pairs:
        assert asked[p["requested_in"]] == 1 and p["answered_in"] is not None
    order = [r["call_id"] for r in rows]
    for p, want in zip(pairs, conversations, strict=True):
        assert json.loads(p["arguments"])["call"] == want["call"] and p["output"] == want["output"]
        # Asked in its conversation's first call, answered in its second: the conversations ran
        # X1, Y1, Y2, X2 (per API), so X's answer comes two calls after its question, Y's one.
        assert order.index(p["answered_in"]) - order.index(p["requested_in"]) == want["gap"]
    assert amb(store, "verify").returncode == 0


def _record_agent(tmp_path: Path, fake: FakeUpstream, upstreams: str, agent: str, calls: int, py: Path):
    """Records ``agent`` (a script of tests/fakes/agents) against ``fake`` started as the upstreams
    ``upstreams`` names (``{url}``: the fake's); the store and the agent's client.json."""
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    with fake:
        ups = upstreams.format(url=fake.url).split()
        res = record(store, ws, ups, [str(py), str(AGENTS / agent)], REAL_KEYS)
    assert res.returncode == 0, res.stderr
    assert f"run {run_id_of(res)}: completed, exit code 0, {calls} model calls" in res.stderr
    return store, json.loads((ws / "client.json").read_text())


def test_google_genai_two_conversations_with_one_opening(tmp_path, agents_py):
    fake = FakeUpstream(prefix="/google", numbered_calls=True)
    store, client = _record_agent(tmp_path, fake, "gemini={url}/google", "genai_twins_agent.py", 4, agents_py)
    streams = sql(store, "SELECT stream FROM model_calls ORDER BY seq")
    assert [s["stream"] for s in streams] == [True, False, False, True]
    x, y = client["x"], client["y"]
    _paired_as_the_client_saw(
        store,
        [
            {"call": x["args"]["call"], "output": x["output"], "gap": 3},
            {"call": y["args"]["call"], "output": y["output"], "gap": 1},
        ],
    )


def test_sdks_on_a_gateway_that_reuses_tool_call_ids(tmp_path, agents_py):
    fake = FakeUpstream(call_id="call_0", numbered_calls=True)
    ups = "openai={url} anthropic={url}"
    store, client = _record_agent(tmp_path, fake, ups, "reused_ids_agent.py", 12, agents_py)
    got = client["conversations"]
    assert {c["id"] for api in got.values() for c in api.values()} == {"call_0"}  # as the SDKs saw them
    want = []
    for api in ("chat", "responses", "messages"):
        for name, gap in (("x", 3), ("y", 1)):
            c = got[api][name]
            want.append({"call": int(c["output"].rsplit(" ", 1)[1]), "output": c["output"], "gap": gap})
    _paired_as_the_client_saw(store, want)
