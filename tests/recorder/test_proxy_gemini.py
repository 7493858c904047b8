"""The Gemini API parser, gateway usage spellings, and upstreams with a base path (unit level; the
SDKs through amb-record are in tests/amb/test_record_providers.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from mitmproxy.http import Headers

from recorder.proxy import calls, history
from recorder.proxy.custody import Custody
from recorder.proxy.ledger import Ledger
from recorder.proxy.skim import MIN_SPAN
from recorder.proxy.upstreams import parse, resolve
from schemas.errors import UsageError
from schemas.events import ModelCallCompleted, ToolCallRequested, ToolCallResult, Usage
from schemas.providers import CHAT, COUNT_TOKENS, GENERATE, RESPONSES, STREAM_GENERATE, gemini, openai_chat
from tests.fakes.harness import REAL_KEYS, Recording
from tests.fakes.upstream import GEMINI_THOUGHT, TEXT, TOOL_ARGS, FakeUpstream

USAGE = {
    "promptTokenCount": 210,
    "cachedContentTokenCount": 150,
    "candidatesTokenCount": 33,
    "thoughtsTokenCount": 11,
    "toolUsePromptTokenCount": 4,
    "totalTokenCount": 258,
}
# By hand: input = prompt 210 + tool-use prompt 4 (cached 150 inside); output = 33 + thoughts 11.
USAGE_NORMALISED = Usage(input_total=214, cache_read=150, output=44, reasoning=11)


def chunk(parts: list, finish: str | None = None, usage: dict | None = None) -> dict:
    cand: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        cand["finishReason"] = finish
    out: dict = {"candidates": [cand], "modelVersion": "gemini-test-001"}
    if usage:
        out["usageMetadata"] = usage
    return out


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1beta/models/gemini-2.5-flash:generateContent", GENERATE),
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", STREAM_GENERATE),
        ("/gw/google/v1/models/g:countTokens", COUNT_TOKENS),
        ("/v1/projects/p/locations/l/publishers/google/models/g:generateContent", GENERATE),
        ("/v1beta/tunedModels/mine:generateContent", GENERATE),
        ("/v1beta/models/g:embedContent", None),
        ("/v1beta/models/g", None),
        ("/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21", CHAT),
        ("/api/paas/v4/chat/completions", CHAT),
        ("/openai/v1/responses", RESPONSES),
    ],
)
def test_classify(path, api):
    assert calls.classify("POST", path) is api


def test_model_in_path():
    assert (
        calls.model_in_path("https://h:443/v1beta/models/gemini-2.5-pro:generateContent") == "gemini-2.5-pro"
    )
    assert (
        calls.model_in_path("https://h:443/openai/deployments/my-gpt/chat/completions?api-version=1")
        == "my-gpt"
    )
    assert calls.model_in_path("https://h:443/v1/chat/completions") is None


def test_usage_containment():
    assert gemini.usage(USAGE) == USAGE_NORMALISED
    assert gemini.usage(None) is None


def test_json_response_with_thought_text_and_function_call_raw_args():
    raw_args = '{"path":  "a.txt", "n": 1.50}'  # spacing and a float as the wire has them
    body = (
        '{"candidates": [{"content": {"role": "model", "parts": ['
        '{"text": "hmm", "thought": true}, {"text": "Hello"}, {"text": " there"},'
        '{"functionCall": {"name": "read_file", "args": ' + raw_args + "}}]},"
        '"finishReason": "STOP", "index": 0}], "usageMetadata": ' + json.dumps(USAGE) + ","
        '"modelVersion": "gemini-test-001"}'
    ).encode()
    result, _, err = calls.parse_response(GENERATE, body, None, "application/json")
    assert err is None and result.complete
    msg = result.message()
    assert (msg.text, msg.reasoning) == ("Hello there", "hmm")
    assert [(t.name, t.arguments) for t in msg.tool_calls] == [("read_file", raw_args)]
    assert result.usage == USAGE_NORMALISED and result.stop_reason == "STOP"
    assert result.model == "gemini-test-001"


def sse(chunks: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)


STREAM = [
    chunk([{"text": "thinking", "thought": True}]),
    chunk([{"text": "Hel"}]),
    chunk([{"text": "lo"}]),
    chunk([{"functionCall": {"name": "a", "args": {"x": 1}}}, {"functionCall": {"name": "b", "args": {}}}]),
    chunk([], "STOP", USAGE),
]


def test_sse_stream():
    result, _, _ = calls.parse_response(STREAM_GENERATE, sse(STREAM), None, "text/event-stream")
    msg = result.message()
    assert (msg.text, msg.reasoning, result.complete) == ("Hello", "thinking", True)
    assert [(t.name, t.arguments) for t in msg.tool_calls] == [("a", '{"x": 1}'), ("b", "{}")]
    assert result.usage == USAGE_NORMALISED


def test_json_array_stream_whole_and_cut_off():
    whole = ("[" + ",\r\n".join(json.dumps(c) for c in STREAM) + "]").encode()
    result, _, _ = calls.parse_response(STREAM_GENERATE, whole, None, "application/json")
    assert result.complete and result.message().text == "Hello" and len(result.tool_calls) == 2
    cut = whole[: whole.index(b'"lo"') + 10]  # inside the third element
    result, _, _ = calls.parse_response(STREAM_GENERATE, cut, None, "application/json")
    assert not result.complete and result.message().text == "Hel"


def test_error_body():
    body = b'{"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}}'
    result, _, _ = calls.parse_response(GENERATE, body, None, "application/json")
    assert result.error == "API key not valid."


def test_a_blocked_prompt_is_the_stop_reason():
    body = b'{"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 9}}'
    result, _, _ = calls.parse_response(GENERATE, body, None, "application/json")
    assert (result.stop_reason, result.usage, result.message().text) == (
        "prompt_blocked: SAFETY",
        Usage(input_total=9),
        "",
    )


def test_count_tokens_is_a_call_that_generated_nothing_and_answers_no_tool():
    req = {
        "contents": [{"role": "user", "parts": [{"functionResponse": {"name": "a", "response": {"o": 1}}}]}]
    }
    info = calls.parse_request(COUNT_TOKENS, json.dumps(req).encode())
    assert info.tool_results == []
    result, _, _ = calls.parse_response(COUNT_TOKENS, b'{"totalTokens": 42}', None, "application/json")
    assert result.usage == Usage() and result.complete


def conversation(with_ids: bool) -> list[dict]:
    def fc(name: str, i: int) -> dict:
        return {"functionCall": {"name": name, "args": {"i": i}, **({"id": f"id-{i}"} if with_ids else {})}}

    def fr(name: str, i: int, response: dict) -> dict:
        return {
            "functionResponse": {
                "name": name,
                "response": response,
                **({"id": f"id-{i}"} if with_ids else {}),
            }
        }

    return [
        {
            "role": "user",
            "parts": [{"text": "do it"}, {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}],
        },
        {"role": "model", "parts": [{"text": "ok"}, fc("read", 0), fc("list", 1)]},
        {
            "role": "user",
            "parts": [fr("read", 0, {"output": "file text"}), fr("list", 1, {"error": "denied"})],
        },
    ]


FIRST_ANSWER = chunk(
    [
        {"text": "ok"},
        {"functionCall": {"name": "read", "args": {"i": 0}}},
        {"functionCall": {"name": "list", "args": {"i": 1}}},
    ],
    "STOP",
)


def gemini_call(ledger: Ledger, contents: list, answer: dict | None = None) -> tuple[list, list]:
    """One generateContent call through the parser and the ledger: (the ids its function calls
    are recorded under, the function responses recorded with it as (id, name, output, is_error))."""
    info = calls.parse_request(GENERATE, json.dumps({"contents": contents}).encode())
    result, _, _ = calls.parse_response(
        GENERATE,
        json.dumps(answer or chunk([{"text": "done"}], "STOP")).encode(),
        None,
        "application/json",
    )
    fresh = ledger.record("gemini", info, result)
    return [t.id for t in result.message().tool_calls], [
        (r.tool_call_id, r.name, r.output, r.is_error) for r in fresh
    ]


@pytest.mark.parametrize("variant", ["no ids", "the client's ids, answered out of order"])
def test_function_responses_pair_with_the_calls_they_answer(variant):
    ledger = Ledger()
    asked, _ = gemini_call(ledger, conversation(False)[:1], FIRST_ANSWER)
    assert len(set(asked)) == 2 and all(a.startswith("gemini-1-1-") for a in asked)
    second = conversation(variant != "no ids")
    if variant != "no ids":  # ids on the wire (made up by the client, as the Gemini CLI does)
        second[2]["parts"].reverse()
    _, results = gemini_call(ledger, second)
    assert sorted(results) == [(asked[0], "read", "file text", None), (asked[1], "list", "denied", True)]
    # The next turn resends them: nothing new.
    third = [
        *second,
        {"role": "model", "parts": [{"text": "done"}]},
        {"role": "user", "parts": [{"text": "more"}]},
    ]
    assert gemini_call(ledger, third) == ([], [])


def test_a_provider_id_on_a_function_call_is_kept():
    ledger = Ledger()
    answer = json.loads(json.dumps(FIRST_ANSWER))
    answer["candidates"][0]["content"]["parts"][1]["functionCall"]["id"] = "id-0"
    asked, _ = gemini_call(ledger, conversation(False)[:1], answer)
    assert asked[0] == "id-0" and asked[1].startswith("gemini-")
    _, results = gemini_call(ledger, conversation(True))
    assert [r[0] for r in results] == asked


def test_a_history_digest_ignores_inline_data_so_a_skimmed_parse_agrees():
    a = conversation(False)
    a[0]["parts"][1]["inlineData"]["data"] = "A" * (MIN_SPAN + 1)
    b = json.loads(json.dumps(a))
    b[0]["parts"][1]["inlineData"]["data"] = "amb-skimmed-0123"
    assert history.chain(a[:1]) == history.chain(b[:1], marker="amb-skimmed-0123")
    c = json.loads(json.dumps(a))
    c[0]["parts"][0]["text"] = "do something else"
    assert history.chain(a[:1]) != history.chain(c[:1])


@pytest.mark.parametrize(
    ("u", "expected"),
    [
        (  # OpenAI and most compatible providers (GLM, DashScope, NVIDIA)
            {
                "prompt_tokens": 120,
                "completion_tokens": 30,
                "prompt_tokens_details": {"cached_tokens": 100},
                "completion_tokens_details": {"reasoning_tokens": 7},
            },
            Usage(input_total=120, cache_read=100, output=30, reasoning=7),
        ),
        (  # OpenRouter: cache writes too
            {
                "prompt_tokens": 120,
                "completion_tokens": 30,
                "cost": 0.5,
                "prompt_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 5},
            },
            Usage(input_total=120, cache_read=100, cache_write=5, output=30),
        ),
        (  # DeepSeek
            {
                "prompt_tokens": 120,
                "completion_tokens": 30,
                "prompt_cache_hit_tokens": 100,
                "prompt_cache_miss_tokens": 20,
            },
            Usage(input_total=120, cache_read=100, output=30),
        ),
        (  # Moonshot
            {"prompt_tokens": 120, "completion_tokens": 30, "cached_tokens": 100},
            Usage(input_total=120, cache_read=100, output=30),
        ),
        (  # a gateway passing Anthropic's names through in an OpenAI-shaped usage
            {
                "prompt_tokens": 120,
                "completion_tokens": 30,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 9,
            },
            Usage(input_total=120, cache_read=100, cache_write=9, output=30),
        ),
    ],
)
def test_cached_tokens_under_every_spelling(u, expected):
    assert openai_chat.usage(u) == expected


def test_reported_cost_and_served_model():
    body = {
        "model": "openai/gpt-4o-2024-08-06",
        "choices": [{"message": {"content": "x", "reasoning": "r"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "cost": 0.00123},
    }
    r = openai_chat.parse_json(body)
    assert (r.cost, r.model, r.message().reasoning) == (0.00123, "openai/gpt-4o-2024-08-06", "r")
    assert openai_chat.parse_json({"usage": {"cost": True}}).cost is None  # not a number


# -- upstreams ---------------------------------------------------------------------------------


def test_upstream_paths_map_the_agents_base_onto_the_upstreams():
    ups = parse(
        [
            "openai=https://openrouter.ai/api/v1",
            "anthropic=https://gw.example/anthropic/",
            "glm=openai:https://open.bigmodel.cn/api/paas/v4",
            "azure=https://res.openai.azure.com",
        ]
    )
    assert set(ups) == {"openai", "anthropic", "gemini", "glm", "azure"}
    o = ups["openai"]
    assert o.upstream_path("/v1/chat/completions") == "/api/v1/chat/completions"
    assert o.upstream_path("/v1/models?limit=2") == "/api/v1/models?limit=2"
    assert o.upstream_path("/v1") == "/api/v1"
    assert o.upstream_path("/v10/x") == "/api/v1/v10/x"  # /v1 only as a whole segment
    assert ups["anthropic"].upstream_path("/v1/messages") == "/anthropic/v1/messages"
    assert ups["glm"].upstream_path("/v1/chat/completions") == "/api/paas/v4/chat/completions"
    assert (ups["glm"].base_url_var, ups["glm"].key_vars) == ("GLM_BASE_URL", ("GLM_API_KEY",))
    assert ups["azure"].upstream_path("/openai/deployments/d/chat/completions?api-version=1") == (
        "/openai/deployments/d/chat/completions?api-version=1"
    )
    g = ups["gemini"]
    assert (g.host, g.port, g.upstream_path("/v1beta/models/m:generateContent?alt=sse")) == (
        "generativelanguage.googleapis.com",
        443,
        "/v1beta/models/m:generateContent?alt=sse",
    )
    # A bare host keeps the old meaning: /v1/... is forwarded as it is.
    bare = parse(["openai=http://127.0.0.1:8000"])["openai"]
    assert bare.upstream_path("/v1/chat/completions") == "/v1/chat/completions"
    assert bare.agent_base_url("127.0.0.1", 5) == "http://127.0.0.1:5/v1"


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (["openai"], "expected KIND=URL"),
        (["openai=ftp://x"], "http(s)://"),
        (["openai=https://x/v1?key=1"], "no query"),
        (["openai=https://user:pw@x/v1"], "no query, fragment or credentials"),
        (["helper=https://x"], "'helper' is not a kind"),
        (["helper=mistral:https://x"], "unknown kind 'mistral'"),
        (["Bad=openai:https://x"], "the name must be"),
        (["regular=openai:https://x"], "the name must be"),
        (["openai=anthropic:https://x"], "is a kind"),
        (["google=openai:https://x"], "GOOGLE_API_KEY is also gemini's; choose another name"),
        (["openai=https://x", "openai=https://y"], "given twice"),
        (["openai=https://x:99999"], "bad port"),
    ],
)
def test_bad_upstreams_get_one_clear_error(values, says):
    with pytest.raises(UsageError, match="--upstream") as e:
        parse(values)
    assert says in str(e.value)


def test_custody_per_upstream_headers_and_query():
    env = {
        "OPENAI_API_KEY": "sk-real-openai-0123456789",
        "HELPER_API_KEY": "sk-real-helper-abcdef0123",
        "GOOGLE_API_KEY": "AIza-real-google-0123456",  # read when GEMINI_API_KEY is not set
        "AZURE_OPENAI_API_KEY": "azure-real-key-9876543210",
    }
    ups = resolve(
        {
            "openai": "https://openrouter.ai/api/v1",
            "helper": "openai:https://openrouter.ai/api/v1",
            "gemini": "https://gem.example",
            "azure": "https://res.openai.azure.com",
        }
    )
    c = Custody.from_env(env, ups)
    ph = c.placeholders
    # Two upstreams on one host: each placeholder becomes its own key.
    h = Headers(authorization=f"Bearer {ph['helper']}")
    assert c.inject("openrouter.ai", 443, h) and h["authorization"] == "Bearer sk-real-helper-abcdef0123"
    h = Headers(authorization=f"Bearer {ph['openai']}")
    assert c.inject("openrouter.ai", 443, h) and h["authorization"] == "Bearer sk-real-openai-0123456789"
    g = Headers([(b"x-goog-api-key", ph["gemini"].encode())])
    assert c.inject("gem.example", 443, g) and g["x-goog-api-key"] == env["GOOGLE_API_KEY"]
    a = Headers([(b"api-key", ph["azure"].encode())])
    assert c.inject("res.openai.azure.com", 443, a) and a["api-key"] == env["AZURE_OPENAI_API_KEY"]
    path = f"/v1beta/models/m:generateContent?alt=sse&key={ph['gemini']}"
    assert (
        c.inject_query("gem.example", 443, path)
        == f"/v1beta/models/m:generateContent?alt=sse&key={env['GOOGLE_API_KEY']}"
    )
    # Never to another host, nor into the path before the query.
    assert c.inject_query("evil.example", 443, path) == path
    odd = f"/{ph['gemini']}/x"
    assert c.inject_query("gem.example", 443, odd) == odd
    h = Headers(authorization=f"Bearer {ph['helper']}")
    assert not c.inject("gem.example", 443, h)


# -- through the real proxy: a Gemini upstream behind a path prefix --------------------------------


@pytest.fixture(scope="module")
def gfake():
    with FakeUpstream(prefix="/google") as f:
        yield f


@pytest.fixture(scope="module")
def grec(gfake, tmp_path_factory):
    ups = {"openai": gfake.url, "anthropic": gfake.url, "gemini": gfake.url + "/google"}
    r = Recording(tmp_path_factory.mktemp("store"), gfake.url, upstreams=ups).start()
    yield r
    r.stop()


BODY = {
    "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
    "tools": [{"functionDeclarations": [{"name": "read_file"}]}],
}


def one(rec) -> tuple[ModelCallCompleted, list]:
    payloads = rec.new_payloads("model_call.completed")
    got = [p for p in payloads if isinstance(p, ModelCallCompleted)]
    assert len(got) == 1, payloads
    return got[0], payloads


def test_json_array_stream_passes_live_with_the_key_in_the_query(grec, gfake):
    key = grec.custody.placeholders["gemini"]
    url = grec.endpoint("gemini") + f"/v1beta/models/gem:streamGenerateContent?key={key}"
    reads, received = 0, b""
    with httpx.Client() as client:
        headers = {"x-fake-chunks": "10", "x-fake-delay-ms": "20"}
        with client.stream("POST", url, json=BODY, headers=headers) as r:
            assert r.status_code == 200
            for data in r.iter_raw():
                reads += 1
                received += data
    assert reads >= 8  # element by element, not one buffered read
    seen = gfake.requests[-1]
    assert seen.path == f"/google/v1beta/models/gem:streamGenerateContent?key={REAL_KEYS['GEMINI_API_KEY']}"
    call, payloads = one(grec)
    assert (
        call.ok
        and call.stream
        and (call.provider, call.api, call.upstream)
        == (
            "gemini",
            "streamGenerateContent",
            "gemini",
        )
    )
    assert call.url == f"{gfake.url}/google/v1beta/models/gem:streamGenerateContent?key=[redacted]"
    assert (call.requested_model, call.served_model, call.model) == ("gem", "gem-001", "gem-001")
    assert call.message.text == TEXT and call.message.reasoning == GEMINI_THOUGHT
    (tool,) = call.message.tool_calls
    assert tool.name == "read_file" and json.loads(tool.arguments) == TOOL_ARGS
    assert call.usage == Usage(input_total=210, cache_read=150, output=44, reasoning=11)
    assert grec.blobs.get(call.response) == received
    requested = [p for p in payloads if isinstance(p, ToolCallRequested)]
    assert [r.tool_call_id for r in requested] == [tool.id]
    key_bytes = REAL_KEYS["GEMINI_API_KEY"].encode()
    assert key_bytes not in grec.blobs.get(call.request) and key_bytes not in call.url.encode()


def test_sse_stream_and_tool_result_pairing(grec, gfake):
    headers = {"x-goog-api-key": grec.custody.placeholders["gemini"]}
    url = grec.endpoint("gemini") + "/v1beta/models/gem:streamGenerateContent?alt=sse"
    with httpx.Client() as client:
        r = client.post(url, json=BODY, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert gfake.requests[-1].headers["x-goog-api-key"] == REAL_KEYS["GEMINI_API_KEY"]
    call, _ = one(grec)
    (asked,) = call.message.tool_calls
    # The next turn: the model's function call and its response (no ids, as the Gemini API sends).
    turn = {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": TOOL_ARGS}}]}
    answer = {
        "role": "user",
        "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "ok"}}}],
    }
    contents: list[Any] = BODY["contents"]  # type: ignore[assignment]  # BODY is a literal dict of mixed values
    body2 = {**BODY, "contents": [*contents, turn, answer]}
    with httpx.Client() as client:
        client.post(
            grec.endpoint("gemini") + "/v1beta/models/gem:generateContent", json=body2, headers=headers
        )
    call2, payloads = one(grec)
    results = [p for p in payloads if isinstance(p, ToolCallResult)]
    assert [(r.tool_call_id, r.name, r.output, r.model_call_id) for r in results] == [
        (asked.id, "read_file", "ok", call2.call_id)
    ]


def test_reset_mid_stream_keeps_what_arrived(grec):
    url = grec.endpoint("gemini") + "/v1beta/models/gem:streamGenerateContent"
    headers = {"x-goog-api-key": grec.custody.placeholders["gemini"], "x-fake-reset-after": "3"}
    with httpx.Client() as client, pytest.raises(httpx.HTTPError):
        with client.stream("POST", url, json=BODY, headers=headers) as r:
            for _ in r.iter_raw():
                pass
    call, _ = one(grec)
    assert not call.ok and call.partial and call.message.reasoning == GEMINI_THOUGHT
    assert call.message.text and TEXT.startswith(call.message.text)


def test_a_request_outside_the_prefix_is_the_upstreams_404_and_recorded(grec, gfake):
    # The agent's path goes under the upstream's base path: the fake serves only /google/...
    with httpx.Client() as client:
        r = client.post(grec.endpoint("gemini") + "/v1beta/models/gem:generateContent", json=BODY)
    assert r.status_code == 200 and gfake.requests[-1].path.startswith("/google/v1beta/")
    one(grec)


# -- two conversations that open alike, through the real proxy ---------------------------------------


@pytest.fixture
def twins(grec, gfake):
    """The recording, its Gemini upstream's function calls differing from call to call (their
    arguments carry the call's number)."""
    gfake.numbered_calls = True
    yield grec
    gfake.numbered_calls = False


def gemini_post(rec: Recording, contents: list, stream: bool) -> dict:
    """One call as the google-genai SDK makes it; the model turn it answered with, as a client
    puts it in its next request."""
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    url = rec.endpoint("gemini") + f"/v1beta/models/gem:{method}"
    with httpx.Client() as client:
        r = client.post(url, json={**BODY, "contents": contents}, headers={"x-goog-api-key": "k"})
    assert r.status_code == 200
    chunks = (
        [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        if stream
        else [r.json()]
    )
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    return {"role": "model", "parts": parts}


def function_response(turn: dict, output: str) -> dict:
    (fc,) = [p["functionCall"] for p in turn["parts"] if "functionCall" in p]
    return {
        "role": "user",
        "parts": [{"functionResponse": {"name": fc["name"], "response": {"output": output}}}],
    }


def test_two_conversations_with_one_opening_keep_their_calls_and_results_apart(twins):
    # Sub-agents handed one instruction, interleaved; one streams, the other does not. Each asks
    # for a function call; each answers it; the second to answer is the first that asked.
    opening: list[Any] = BODY["contents"]  # type: ignore[assignment]  # BODY is a literal dict of mixed values
    x_turn = gemini_post(twins, opening, stream=True)
    y_turn = gemini_post(twins, opening, stream=False)
    asked = twins.new_payloads("model_call.completed", wait_for=2)
    calls_x, calls_y = [p for p in asked if isinstance(p, ModelCallCompleted)]
    requested = [p for p in asked if isinstance(p, ToolCallRequested)]
    assert [(r.model_call_id, r.tool_call_id) for r in requested] == [
        (calls_x.call_id, calls_x.message.tool_calls[0].id),
        (calls_y.call_id, calls_y.message.tool_calls[0].id),
    ]
    x_id, y_id = (r.tool_call_id for r in requested)
    assert x_id != y_id
    gemini_post(twins, [*opening, y_turn, function_response(y_turn, "y read it")], stream=False)
    gemini_post(twins, [*opening, x_turn, function_response(x_turn, "x read it")], stream=True)
    answered = twins.new_payloads("model_call.completed", wait_for=2)
    results = [(p.tool_call_id, p.output) for p in answered if isinstance(p, ToolCallResult)]
    assert results == [(y_id, "y read it"), (x_id, "x read it")]
    assert not [p for p in answered if isinstance(p, ToolCallRequested)]  # answered: no new call


# -- hostile input -------------------------------------------------------------------------------


HOSTILE: list[Any] = [
    None,
    [],
    "text",
    42,
    {"contents": "not a list"},
    {"contents": [None, 1, "x", {"parts": "nope"}, {"parts": [None, 3, {"functionCall": "x"}]}]},
    {"contents": [{"parts": [{"functionResponse": {"name": None, "id": ["x"], "response": [1, 2]}}]}]},
    {"contents": [{"role": "model", "parts": [{"functionCall": {"name": {"a": 1}, "args": "??"}}]}]},
    {"candidates": "x", "usageMetadata": {"promptTokenCount": "many", "thoughtsTokenCount": True}},
    {"candidates": [{"content": {"parts": [{"text": 5}, {"thought": True}, {"functionCall": {}}]}}]},
    {"candidates": [None], "modelVersion": ["x"]},
    {"generateContentRequest": {"contents": [[[]]]}},
    {"error": "plain string"},
]


@pytest.mark.parametrize("body", HOSTILE)
def test_hostile_bodies_never_raise(body):
    raw = json.dumps(body).encode()
    for api in (GENERATE, STREAM_GENERATE, COUNT_TOKENS):
        calls.parse_request(api, raw)
        for ctype in ("application/json", "text/event-stream"):
            result, _, _ = calls.parse_response(api, raw, None, ctype)
            result.message()
    usage = gemini.usage(body.get("usageMetadata") if isinstance(body, dict) else None)
    assert usage is None or usage.input_total >= 0


def test_hostile_streams_never_raise():
    junk = [
        b"[",
        b"[{",
        b'[{"candidates": [',
        b"]]]",
        b"data: {\n\n",
        b"\xff\xfe",
        b'[{"a": "\\"}',
        b"{" * 10000,
    ]
    for raw in junk:
        for ctype in ("application/json", "text/event-stream"):
            result, _, _ = calls.parse_response(STREAM_GENERATE, raw, None, ctype)
            assert not result.complete


def test_a_spoofed_host_or_absolute_url_still_goes_to_the_configured_upstream(grec, gfake):
    # The reverse endpoint decides where a request goes, not the agent's Host header or request line.
    import socket

    port = grec.proxy.ports["gemini"]
    body = json.dumps(BODY).encode()
    key = grec.custody.placeholders["gemini"]
    for target, host in (
        ("/v1beta/models/gem:generateContent", "evil.example"),
        ("http://evil.example:80/v1beta/models/gem:generateContent", "evil.example"),
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(
                f"POST {target} HTTP/1.1\r\nHost: {host}\r\nx-goog-api-key: {key}\r\n"
                "content-type: application/json\r\nconnection: close\r\n"
                f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        seen = gfake.requests[-1]
        assert seen.path == "/google/v1beta/models/gem:generateContent"
        assert seen.headers["host"] == f"127.0.0.1:{gfake.port}"
        assert seen.headers["x-goog-api-key"] == REAL_KEYS["GEMINI_API_KEY"]
        call, _ = one(grec)
        assert call.url == f"{gfake.url}/google/v1beta/models/gem:generateContent"
