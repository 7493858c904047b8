"""Model calls through the real proxy: the openai (2.x, in-project) and anthropic SDKs, streaming
and not, with tool calls and compressed bodies; the record must equal what the client received."""

from __future__ import annotations

import json
import zlib
from typing import Any

import anthropic
import httpx
import openai
import pytest

from schemas.events import ModelCallCompleted, ToolCallRequested, ToolCallResult
from tests.fakes.blob_contents import blob_contents
from tests.fakes.harness import REAL_KEYS, Recording
from tests.fakes.upstream import TEXT, TOOL_ARGS

TOOLS_CHAT = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
TOOLS_RESP = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
TOOLS_ANT = [{"name": "read_file", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def rec(fake, tmp_path_factory):
    r = Recording(tmp_path_factory.mktemp("store"), fake.url).start()
    yield r
    r.stop()


def oai(rec, encoding=None):
    headers = {"x-fake-encoding": encoding} if encoding else {}
    return openai.OpenAI(
        base_url=rec.base + "/v1",
        api_key=rec.custody.placeholders["openai"],
        max_retries=0,
        default_headers=headers,
    )


def ant(rec, encoding=None):
    headers = {"x-fake-encoding": encoding} if encoding else {}
    return anthropic.Anthropic(
        base_url=rec.base,
        api_key=rec.custody.placeholders["anthropic"],
        max_retries=0,
        default_headers=headers,
    )


def one_call(rec) -> tuple[ModelCallCompleted, list]:
    payloads = rec.new_payloads("model_call.completed")
    calls = [p for p in payloads if isinstance(p, ModelCallCompleted)]
    assert len(calls) == 1, payloads
    assert calls[0].ok, calls[0].error
    return calls[0], payloads


def check_tool(call: ModelCallCompleted, client_id: str, client_args: str, payloads: list) -> None:
    assert [(t.id, t.name) for t in call.message.tool_calls] == [(client_id, "read_file")]
    assert call.message.tool_calls[0].arguments == client_args  # raw string, byte for byte
    assert json.loads(client_args) == TOOL_ARGS
    requested = [p for p in payloads if isinstance(p, ToolCallRequested)]
    assert [(r.tool_call_id, r.model_call_id, r.arguments) for r in requested] == [
        (client_id, call.call_id, client_args)
    ]


@pytest.mark.parametrize("encoding", [None, "gzip", "br"])
@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions(rec, fake, stream, encoding):
    client = oai(rec, encoding)
    args = dict(model="gpt-test", messages=[{"role": "user", "content": "hi"}], tools=TOOLS_CHAT)
    if stream:
        text: list[str] = []
        tc: dict[int, Any] = {}
        for chunk in client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **args
        ):
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                for d in choice.delta.tool_calls or []:
                    t = tc.setdefault(d.index, {"id": "", "args": ""})
                    t["id"] = d.id or t["id"]
                    t["args"] += d.function.arguments or ""
        got_text, got_id, got_args = "".join(text), tc[0]["id"], tc[0]["args"]
    else:
        msg = client.chat.completions.create(**args).choices[0].message
        got_text, got_id, got_args = msg.content, msg.tool_calls[0].id, msg.tool_calls[0].function.arguments
    call, payloads = one_call(rec)
    assert (call.provider, call.api, call.stream, call.ok, call.status) == (
        "openai",
        "chat.completions",
        stream,
        True,
        200,
    )
    assert call.message.text == got_text == TEXT
    check_tool(call, got_id, got_args, payloads)
    assert call.stop_reason == "tool_calls" and call.model == "gpt-test"
    # OpenAI reports cached and reasoning tokens inside the totals: kept as they are.
    assert (call.usage.input_total, call.usage.cache_read, call.usage.output, call.usage.reasoning) == (
        120,
        100,
        30,
        7,
    )
    assert call.usage.reported and call.ttfb_ms is not None and call.latency_ms is not None
    assert call.latency_ms >= call.ttfb_ms
    assert fake.requests[-1].headers["authorization"] == "Bearer " + REAL_KEYS["OPENAI_API_KEY"]


@pytest.mark.parametrize("stream", [False, True])
def test_responses(rec, stream):
    client = oai(rec, "gzip")
    args = dict(model="gpt-test", input="hi", tools=TOOLS_RESP)
    if stream:
        with client.responses.stream(**args) as s:
            deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
            final = s.get_final_response()
        assert deltas == final.output_text
    else:
        final = client.responses.create(**args)
    fc = [o for o in final.output if o.type == "function_call"][0]
    call, payloads = one_call(rec)
    assert (call.api, call.stream, call.ok) == ("responses", stream, True)
    assert call.message.text == final.output_text == TEXT
    check_tool(call, fc.call_id, fc.arguments, payloads)
    assert (call.usage.input_total, call.usage.cache_read, call.usage.output, call.usage.reasoning) == (
        200,
        50,
        40,
        12,
    )
    assert call.stop_reason == "completed"


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages(rec, fake, stream):
    client = ant(rec, "gzip")
    args = dict(
        model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "hi"}], tools=TOOLS_ANT
    )
    if stream:
        raw_args = []
        with client.messages.stream(**args) as s:
            for e in s:
                if e.type == "content_block_delta" and e.delta.type == "input_json_delta":
                    raw_args.append(e.delta.partial_json)
            msg = s.get_final_message()
        client_args = "".join(raw_args)
    else:
        msg = client.messages.create(**args)
        client_args = None
    text = "".join(b.text for b in msg.content if b.type == "text")
    tool = [b for b in msg.content if b.type == "tool_use"][0]
    call, payloads = one_call(rec)
    assert (call.provider, call.api, call.stream, call.ok) == ("anthropic", "messages", stream, True)
    assert call.message.text == text == TEXT
    recorded = call.message.tool_calls[0]
    assert (recorded.id, recorded.name) == (tool.id, "read_file")
    assert json.loads(recorded.arguments) == tool.input == TOOL_ARGS
    if client_args is not None:
        assert recorded.arguments == client_args
    # Anthropic reports cached input beside input_tokens: input_total is the sum.
    assert (call.usage.input_total, call.usage.cache_read, call.usage.cache_write, call.usage.output) == (
        500,
        400,
        70,
        25,
    )
    assert call.stop_reason == "tool_use"
    assert fake.requests[-1].headers["x-api-key"] == REAL_KEYS["ANTHROPIC_API_KEY"]


@pytest.mark.parametrize(
    "path,stream",
    [
        ("/v1/chat/completions", True),
        ("/v1/responses", True),
        ("/v1/messages", True),
        ("/v1/chat/completions", False),
    ],
)
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_response_blob_equals_bytes_received(rec, path, stream, encoding):
    body = {
        "model": "m",
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
        "input": "hi",
        "max_tokens": 5,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-fake-encoding": encoding, "accept-encoding": encoding, "x-fake-chunks": "12"}
    with httpx.Client() as client:
        with client.stream("POST", rec.base + path, json=body, headers=headers) as r:
            assert r.headers.get("content-encoding") == encoding  # passed through untouched
            received = b"".join(r.iter_bytes())
    call, _ = one_call(rec)
    assert call.ok and call.response is not None
    assert rec.blobs.get(call.response) == received
    assert call.message.text == TEXT
    assert json.loads(rec.blobs.get(call.request))["model"] == "m"


def test_streams_are_passed_through_not_buffered(rec):
    # 20 chunks 25 ms apart (~0.5 s): the first chunk must reach the client long before the end.
    import time

    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-fake-chunks": "20", "x-fake-delay-ms": "25"}
    arrivals = []
    t0 = time.perf_counter()
    with httpx.Client() as client:
        with client.stream("POST", rec.base + "/v1/chat/completions", json=body, headers=headers) as r:
            for _ in r.iter_raw():
                arrivals.append(time.perf_counter() - t0)
    call, _ = one_call(rec)  # first: a failure below must not leave it for the next test
    # Relative to the stream itself, not to a clock (a loaded machine delays everything): a buffered
    # stream arrives all at once, a passed-through one spread over the upstream's 19 pauses.
    assert arrivals[-1] > 0.4
    spread = arrivals[-1] - arrivals[0]
    assert spread > 0.3, f"the chunks arrived within {spread:.3f}s: the proxy buffered the stream"
    assert len(arrivals) >= 15  # one client read per upstream chunk, roughly
    assert call.ttfb_ms is not None and call.latency_ms is not None
    assert call.latency_ms - call.ttfb_ms > 300 and call.latency_ms > 400


def test_tool_results_are_paired_and_history_not_double_counted(rec):
    client = oai(rec)
    msgs = [{"role": "user", "content": "hi"}]
    r1 = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS_CHAT).choices[0].message
    c1, p1 = one_call(rec)
    msgs += [
        r1.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": r1.tool_calls[0].id, "content": "A" * 20000},
    ]
    r2 = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS_CHAT).choices[0].message
    c2, p2 = one_call(rec)
    results = [p for p in p2 if isinstance(p, ToolCallResult)]
    assert [(r.tool_call_id, r.model_call_id, r.name) for r in results] == [
        (r1.tool_calls[0].id, c2.call_id, "read_file")
    ]
    assert len(results[0].output) == 16 * 1024 and rec.blobs.get(results[0].output_blob) == b"A" * 20000
    # Turn 3 resends the whole history, including the answered tool call: no new tool events.
    msgs += [r2.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    client.chat.completions.create(model="m", messages=msgs, tools=TOOLS_CHAT)
    _, p3 = one_call(rec)
    assert not [p for p in p3 if isinstance(p, (ToolCallResult, ToolCallRequested))]


def test_anthropic_tool_result_pairing(rec):
    client = ant(rec)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    m1 = client.messages.create(model="c", max_tokens=9, messages=msgs, tools=TOOLS_ANT)
    one_call(rec)
    tool = [b for b in m1.content if b.type == "tool_use"][0]
    msgs += [
        {"role": "assistant", "content": [b.model_dump() for b in m1.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool.id, "content": "no such file", "is_error": True}
            ],
        },
    ]
    client.messages.create(model="c", max_tokens=9, messages=msgs, tools=TOOLS_ANT)
    c2, p2 = one_call(rec)
    (res,) = [p for p in p2 if isinstance(p, ToolCallResult)]
    assert (res.tool_call_id, res.output, res.is_error, res.name, res.model_call_id) == (
        tool.id,
        "no such file",
        True,
        "read_file",
        c2.call_id,
    )


def test_usage_is_estimated_when_not_reported(rec):
    client = oai(rec)
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x" * 400}], extra_headers={"x-fake-no-usage": "1"}
    )
    call, _ = one_call(rec)
    assert not call.usage.reported and call.usage.input_total == 100 and call.usage.output > 0


def test_large_request_body_is_recorded(rec):
    big = "A" * (5 * 1024 * 1024)
    client = oai(rec)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": big}])
    call, _ = one_call(rec)
    assert call.request is not None
    assert call.request.size > 5 * 1024 * 1024
    assert json.loads(rec.blobs.get(call.request))["messages"][0]["content"] == big


def test_a_compression_bomb_is_recorded_as_sent(rec):
    # An agent's request of 300 KB that gunzips to 300 MiB: the proxy keeps the bytes it forwarded,
    # undecoded (it would otherwise hold the whole expansion), and goes on recording.
    gz = zlib.compressobj(wbits=31)
    bomb = gz.compress(b'{"model": "m", "messages": [' + b" " * (300 * 1024 * 1024)) + gz.flush()
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    with httpx.Client() as client:
        r = client.post(rec.base + "/v1/chat/completions", content=bomb, headers=headers, timeout=60)
    assert r.status_code == 400  # the upstream's answer to a body that is not JSON, passed through
    calls = [p for p in rec.new_payloads("model_call.completed") if isinstance(p, ModelCallCompleted)]
    assert len(calls) == 1 and calls[0].request is not None
    assert calls[0].request.media_type == "application/octet-stream"
    assert rec.blobs.get(calls[0].request) == bomb
    oai(rec).chat.completions.create(model="m", messages=[{"role": "user", "content": "after"}])
    call, _ = one_call(rec)
    assert json.loads(rec.blobs.get(call.request))["messages"][0]["content"] == "after"


def test_a_conversation_is_stored_as_deltas(rec):
    """Each request of a growing conversation is kept as a delta against the one before (and each
    response against the previous response): the run pack holds little more than the new turns."""
    from recorder.spool import spool_path
    from schemas import blobcodec
    from schemas.blob import BlobRef
    from schemas.blobpack import pack_path, read_records
    from schemas.blobstore import loose_codec

    client = oai(rec)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are careful. " * 200}]
    requests: list[BlobRef] = []
    for turn in range(6):
        messages.append({"role": "user", "content": f"turn {turn}: " + "details " * 50})
        args: dict[str, Any] = {"model": "gpt-test", "messages": messages}
        client.chat.completions.create(**args)
        call, _ = one_call(rec)
        assert call.request is not None
        requests.append(call.request)
        messages.append({"role": "assistant", "content": f"answer {turn}"})
    pack = pack_path(spool_path(rec.store, rec.run_id, "proxy"))
    records = dict(read_records(pack.read_bytes(), pack.name)[0])
    codecs = [loose_codec(records[r.blob[7:]]) for r in requests]
    assert codecs[1:] == [blobcodec.DELTA] * 5, codecs
    assert all(len(records[r.blob[7:]]) < 400 for r in requests[1:])  # each body is ~4-6 KB
    assert [json.loads(rec.blobs.get(r))["messages"] for r in requests] == [
        messages[: 2 * i + 2] for i in range(6)
    ]


def test_no_key_bytes_anywhere(rec):
    # Runs last in this module: everything recorded so far must be free of the real keys.
    keys = [k.encode() for k in REAL_KEYS.values()]
    spool = (rec.store / "spool").rglob("*.spool")
    for path in spool:
        data = path.read_bytes()
        assert not any(k in data for k in keys)
    contents = list(blob_contents(rec.store / "blobs"))  # the run's blob pack, materialised
    assert contents
    for where, content in contents:
        assert not any(k in content for k in keys), where


# -- a gateway that reuses its tool call ids ---------------------------------------------------------


@pytest.fixture
def reusing(rec, fake):
    """The recording, its upstream giving every tool call the id ``call_0`` (as some gateways do),
    the calls differing only in their arguments."""
    fake.call_id, fake.numbered_calls = "call_0", True
    yield rec
    fake.call_id, fake.numbered_calls = None, False


def _read(args: Any) -> str:
    """What the tool answers: which call it was (the fake numbers them in their arguments)."""
    return f"output of call {(json.loads(args) if isinstance(args, str) else args)['call']}"


def _turn(rec, api: str, history: list) -> list:
    """One call of ``api`` with ``history``; the items the client adds to it for the next call
    (the model's turn, and the answer to its tool call if it made one)."""
    if api == "chat":
        msg = (
            oai(rec).chat.completions.create(model="m", messages=history, tools=TOOLS_CHAT).choices[0].message
        )
        answer = [
            {"role": "tool", "tool_call_id": t.id, "content": _read(t.function.arguments)}
            for t in msg.tool_calls or []
        ]
        return [msg.model_dump(exclude_none=True), *answer]
    if api == "responses":
        out = oai(rec).responses.create(model="m", input=history, tools=TOOLS_RESP).output
        answer = [
            {"type": "function_call_output", "call_id": o.call_id, "output": _read(o.arguments)}
            for o in out
            if o.type == "function_call"
        ]
        return [o.model_dump(exclude_none=True) for o in out] + answer
    m = ant(rec).messages.create(model="c", max_tokens=9, messages=history, tools=TOOLS_ANT)
    answer = [
        {"type": "tool_result", "tool_use_id": b.id, "content": _read(b.input)}
        for b in m.content
        if b.type == "tool_use"
    ]
    return [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": answer},
    ]


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_reused_tool_call_ids_in_two_conversations_with_one_opening(reusing, api):
    opening = [{"role": "user", "content": "read the notes"}]
    x = opening + _turn(reusing, api, opening)
    y = opening + _turn(reusing, api, opening)
    asked = reusing.new_payloads("model_call.completed", wait_for=2)
    requested = [p for p in asked if isinstance(p, ToolCallRequested)]
    calls = [p for p in asked if isinstance(p, ModelCallCompleted)]
    assert [(r.model_call_id, r.tool_call_id) for r in requested] == [
        (c.call_id, c.message.tool_calls[0].id) for c in calls
    ]
    x_call, y_call = requested
    # The first call of the run keeps the provider's id; every later one is told apart from it.
    assert x_call.tool_call_id != y_call.tool_call_id and y_call.tool_call_id.startswith("call_0~")
    _turn(reusing, api, y)  # Y answers first
    _turn(reusing, api, x)
    answered = reusing.new_payloads("model_call.completed", wait_for=2)
    results = [(p.tool_call_id, p.output) for p in answered if isinstance(p, ToolCallResult)]
    assert results == [
        (y_call.tool_call_id, _read(y_call.arguments)),
        (x_call.tool_call_id, _read(x_call.arguments)),
    ]
