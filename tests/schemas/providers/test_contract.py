"""The provider contract: every model API of ``schemas.providers`` through the same tests.

A request built from one conversation is read back as that conversation and paired like the
proxy pairs it; what the fake upstream answers (a loopback fake of the real APIs, whole and
streamed) is reassembled; the request is rendered for a person and for a judge; a reply built
into a response (whole and streamed) reads back as that reply; the recorded call is served again
by the replay endpoint byte for byte; and it goes through the ATIF export and import and back. A
new provider is one module, its entries in the registry, and its cases here.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from recorder.importers import atif as atif_import
from replay.export import atif as atif_export
from replay.ingest import ingest
from replay.replayer.server import ReplayServer, open_replayer
from schemas import providers
from schemas.codec import Event
from schemas.events import AssistantMessage, ModelCallCompleted, ToolCallPart, ToolCallRequested, Usage
from schemas.providers import render
from schemas.providers.conversation import Conversation, Kind, Message, Part, Reply, Tool
from tests.fakes.events import unsigned_events
from tests.fakes.harness import Recording
from tests.fakes.upstream import GEMINI_THOUGHT, TEXT, TOOL_ARGS, FakeUpstream

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
READ_FILE = Tool("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})


@dataclass(frozen=True)
class Case:
    api: providers.Api
    upstream: str
    """The kind of upstream (the proxy endpoint the request goes to)."""
    path: str
    """The request's path under the kind's base URL."""
    stream: bool


CASES = {
    "chat": Case(providers.CHAT, "openai", "/v1/chat/completions", False),
    "chat-stream": Case(providers.CHAT, "openai", "/v1/chat/completions", True),
    "responses": Case(providers.RESPONSES, "openai", "/v1/responses", False),
    "responses-stream": Case(providers.RESPONSES, "openai", "/v1/responses", True),
    "messages": Case(providers.MESSAGES, "anthropic", "/v1/messages", False),
    "messages-stream": Case(providers.MESSAGES, "anthropic", "/v1/messages", True),
    "gemini": Case(providers.GENERATE, "gemini", "/v1beta/models/gemini-test:generateContent", False),
    "gemini-sse": Case(
        providers.STREAM_GENERATE, "gemini", "/v1beta/models/gemini-test:streamGenerateContent?alt=sse", True
    ),
    "gemini-array": Case(
        providers.STREAM_GENERATE, "gemini", "/v1beta/models/gemini-test:streamGenerateContent", True
    ),
}
NAMES = list(CASES)
APIS = ["chat.completions", "responses", "messages", "generateContent"]
STOP = {"openai": "tool_calls", "anthropic": "tool_use", "gemini": "STOP"}
"""A stop reason each provider's responses say (Responses: its status)."""


def opening(name: str) -> Conversation:
    """A first request: a system prompt, and a user turn with text and an image, offering a tool."""
    user = Message(
        "user", [Part(Kind.TEXT, f"read notes.md ({name})"), Part.image(None, _b64(PNG), "image/png")]
    )
    return Conversation([Message("system", [Part(Kind.TEXT, "Be brief.")]), user], [READ_FILE], "fake-model")


def follow_up(name: str) -> Conversation:
    """The next request: the model's turn with its tool call, and the tool's result."""
    conv = opening(name)
    call = Part.call("call_1", "read_file", {"path": "notes.md"})
    conv.messages += [
        Message("assistant", [Part(Kind.TEXT, "Reading it."), call]),
        Message("tool", [Part.result("notes: ok", "call_1", "read_file")]),
    ]
    return conv


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def flat(conv: Conversation) -> list[tuple[Any, ...]]:
    """A conversation's parts in order, with what every provider keeps of them."""
    out: list[tuple[Any, ...]] = []
    for m in conv.messages:
        for p in m.parts:
            if p.kind == Kind.TOOL_CALL:
                out.append((p.kind, p.name, json.loads(p.arguments)))
            elif p.kind == Kind.TOOL_RESULT:
                out.append((p.kind, p.text))
            elif p.kind == Kind.IMAGE:
                out.append((p.kind, p.data_url))
            else:
                out.append((p.kind, p.text))
    return out


def body_of(case: Case, conv: Conversation) -> bytes:
    return json.dumps(case.api.module.build_request(conv, stream=case.stream)).encode()


# ---------------------------------------------------------------- requests


@pytest.mark.parametrize("api", APIS)
def test_a_built_request_reads_back_as_its_conversation(api):
    conv = follow_up(api)
    body = providers.APIS[api].module.build_request(conv)
    back = providers.conversation(api, json.loads(json.dumps(body)))
    assert flat(back) == flat(conv)
    assert back.system() == "Be brief." and [t.name for t in back.tools] == ["read_file"]
    assert [m.role for m in back.messages][:2] == ["system", "user"]
    assert back.messages[-1].role in ("tool", "user")  # Anthropic's results are the user's turn


@pytest.mark.parametrize("api", APIS)
def test_a_requests_tool_result_is_paired_with_its_call(api):
    body = providers.APIS[api].module.build_request(follow_up(api))
    info = providers.parse_request(providers.APIS[api], body)
    assert [(r.output, r.name) for r in info.tool_results] == [("notes: ok", "read_file")]
    (turn,) = info.model_turns.values()
    # The arguments as the body has them: JSON text (OpenAI) or an object (Anthropic, Gemini).
    assert [(name, json.loads(args) if isinstance(args, str) else args) for _, name, args in turn.calls] == [
        ("read_file", {"path": "notes.md"})
    ]
    assert info.chars > 0 and info.items is not None


@pytest.mark.parametrize("api", APIS)
def test_a_request_renders_for_a_person_and_a_judge(api):
    conv = providers.conversation(api, providers.APIS[api].module.build_request(follow_up(api)))
    shown, images = render.for_person(conv, 1000, lambda text, n: text[:n])
    assert images == ["data:image/png;base64," + _b64(PNG)]
    parts = [p for m in shown for p in m.get("parts", [])]
    assert {"type": "image", "index": 0, "chars": len(images[0])} in parts
    assert any(p["type"] == "tool_call" and p["name"] == "read_file" for p in parts)
    assert any(p["type"] == "tool_result" and p["text"] == "notes: ok" for p in parts)
    assert render.opening(conv) == [("system", "Be brief."), ("user", f"read notes.md ({api})\n[image]")]


HOSTILE: list[Any] = [
    None,
    [],
    "text",
    {"messages": "x", "input": 3, "contents": {"a": 1}, "system": 5, "tools": "t"},
    {"messages": [1, None, {"role": 3, "content": {"x": []}, "tool_calls": [None, {"function": 1}]}]},
    {"input": [{"type": "function_call", "arguments": {"a": [1]}}, {"type": 7}, {"content": [None, 5]}]},
    {"contents": [{"role": "model", "parts": [{"functionCall": "x"}, {"inlineData": {"data": 5}}, 3]}]},
    {
        "contents": [
            {"parts": [{"inline_data": {"mime_type": "image/png", "data": "-_-_"}}, {"fileData": {}}]}
        ]
    },
    {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "base64"}}, {"type": "tool_result"}],
            }
        ]
    },
    {"tools": [{"functionDeclarations": [None, {"name": 3}]}, {"function": {"name": None}}, {"name": ""}]},
]


@pytest.mark.parametrize("api", APIS)
def test_hostile_request_bodies_read_as_what_they_hold(api):
    """Whatever an agent sends: no exception, text stays text, no image that is not one."""
    for body in HOSTILE:
        conv = providers.conversation(api, body)
        shown, images = render.for_person(conv, 100, lambda text, n: text[:n])
        render.opening(conv)
        render.semconv(conv.messages)
        assert all(i.startswith("data:") for i in images) and len(shown) == len(conv.messages)
        providers.parse_request(providers.APIS[api], body)


# ---------------------------------------------------------------- responses


def reply() -> Reply:
    calls = [ToolCallPart(id="call_7", name="read_file", arguments=json.dumps(TOOL_ARGS))]
    message = AssistantMessage(text=TEXT, reasoning="First, the file.", tool_calls=calls)
    return Reply(message, "fake-model", None, Usage(input_total=210, cache_read=150, output=44), "resp-1")


def assert_same_answer(result: Any, want: Reply) -> None:
    assert said(result.message()) == said(want.message)
    assert result.stop_reason == want.stop_reason
    assert result.usage is not None and want.usage is not None
    assert (result.usage.input_total, result.usage.cache_read, result.usage.output) == (210, 150, 44)


@pytest.mark.parametrize("name", NAMES)
def test_a_built_response_reads_back_as_its_reply(name):
    case = CASES[name]
    want = reply()
    want.stop_reason = STOP[case.api.provider] if case.api is not providers.RESPONSES else "completed"
    media = "application/json"
    body = providers.build_response(case.api, want, stream=case.stream, path=case.path)
    if case.stream:
        media = "application/json" if body.startswith(b"[") else "text/event-stream"
        assert media == ("application/json" if name == "gemini-array" else "text/event-stream")
    result = providers.parse_response(case.api, body, media)
    assert result.complete and result.error is None
    assert_same_answer(result, want)


# ---------------------------------------------------------------- recorded through the proxy


@dataclass
class Recorded:
    store: Path
    run_id: str
    request: dict[str, bytes]
    """Each case's request body."""
    answer: dict[str, tuple[bytes, str]]
    """What the client got for each case (body, media type) through the recording proxy."""
    events: list[Event]
    blobs: Any


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    """Every case sent once through the real recording proxy to the fake upstream, then ingested."""
    store = tmp_path_factory.mktemp("contract") / "store"
    requests, answers = {}, {}
    with FakeUpstream() as fake:
        rec = Recording(store, fake.url).start()
        try:
            with httpx.Client(timeout=30) as client:
                for name, case in CASES.items():
                    base = rec.endpoint(case.upstream).removesuffix("/v1")
                    requests[name] = body_of(case, opening(name))
                    r = client.post(
                        base + case.path, content=requests[name], headers={"content-type": "application/json"}
                    )
                    assert r.status_code == 200, r.text
                    answers[name] = (r.content, r.headers["content-type"].split(";")[0])
            rec.new_payloads("model_call.completed", wait_for=len(CASES), timeout=30)
        finally:
            rec.stop()
    events = rec.events()
    blobs = rec.blobs
    ingest(store)
    return Recorded(store, rec.run_id, requests, answers, events, blobs)


def call_event(recorded: Recorded, name: str) -> Event:
    """The recorded model call of a case (found by its request body)."""
    for e in recorded.events:
        p = e.payload
        if isinstance(p, ModelCallCompleted) and p.request is not None:
            if recorded.blobs.get(p.request) == recorded.request[name]:
                return e
    raise AssertionError(f"no recorded call for {name}")


@pytest.mark.parametrize("name", NAMES)
def test_what_the_upstream_sends_is_reassembled(name, recorded):
    case = CASES[name]
    body, media = recorded.answer[name]
    result = providers.parse_response(case.api, body, media)
    got = result.message()
    assert result.complete and got.text == TEXT
    assert [(t.name, json.loads(t.arguments)) for t in got.tool_calls] == [("read_file", TOOL_ARGS)]
    if case.upstream == "gemini":
        assert got.reasoning == GEMINI_THOUGHT
    p = call_event(recorded, name).payload
    assert isinstance(p, ModelCallCompleted)
    assert (p.api, p.provider, p.stream, p.ok) == (case.api.api, case.api.provider, case.stream, True)
    # The proxy recorded what the layer reassembles (the ids of Gemini's calls are the ledger's).
    assert (p.message.text, p.message.reasoning) == (got.text, got.reasoning)
    assert [(t.name, t.arguments) for t in p.message.tool_calls] == [
        (t.name, t.arguments) for t in got.tool_calls
    ]


@pytest.fixture(scope="module")
def replay_server(recorded):
    with ReplayServer(open_replayer(recorded.store, recorded.run_id, "canonical", "fast")) as server:
        yield server


@pytest.mark.parametrize("name", NAMES)
def test_the_replay_endpoint_serves_it_again(name, recorded, replay_server):
    case = CASES[name]
    r = httpx.post(
        replay_server.url + case.path,
        content=recorded.request[name],
        headers={"content-type": "application/json"},
        timeout=30,
    )
    body, media = recorded.answer[name]
    assert r.status_code == 200 and r.headers["x-amb-replay"] == "canonical"
    assert (r.content, r.headers["content-type"]) == (body, media)
    assert r.headers.get("transfer-encoding") == ("chunked" if case.stream else None)


@pytest.mark.parametrize("name", NAMES)
def test_it_goes_through_the_atif_export_and_back(name, recorded, tmp_path):
    case = CASES[name]
    call = call_event(recorded, name)
    assert isinstance(call.payload, ModelCallCompleted)
    asked = [
        e
        for e in recorded.events
        if isinstance(e.payload, ToolCallRequested) and e.payload.model_call_id == call.payload.call_id
    ]
    first = atif_export.build([call, *asked], recorded.blobs.get)
    steps = first.trajectory["steps"]
    assert [(s["source"], s["message"]) for s in steps[:2]] == [
        ("system", "Be brief."),
        ("user", f"read notes.md ({name})"),
    ]
    assert steps[2]["tool_calls"][0]["function_name"] == "read_file"
    assert [t["function"]["name"] for t in first.trajectory["agent"]["tool_definitions"]] == ["read_file"]
    (tmp_path / "trajectory.json").write_text(json.dumps(first.trajectory))
    (run,) = atif_import.parse(tmp_path / "trajectory.json")
    imported = [p for _, p in run.events if isinstance(p, ModelCallCompleted)]
    assert [(p.api, p.provider) for p in imported] == [(case.api.api, case.api.provider)]
    # The import rebuilds the request and the answer in the call's own API.
    assert imported[0].request is not None and imported[0].response is not None
    request = json.loads(run.blobs[imported[0].request.blob])
    assert flat(providers.conversation(case.api.api, request))[:2] == [
        (Kind.TEXT, "Be brief."),
        (Kind.TEXT, f"read notes.md ({name})"),
    ]
    answer = providers.parse_response(case.api, run.blobs[imported[0].response.blob], "application/json")
    assert said(answer.message()) == said(imported[0].message)
    events = [
        msgspec.structs.replace(e, ts_ns=ts)
        for e, (ts, _) in zip(
            unsigned_events("contract", "import", [p for _, p in run.events]), run.events, strict=True
        )
    ]
    again = atif_export.build(events, lambda ref: _blob(run, ref))
    assert again.trajectory["steps"] == steps and again.trajectory["agent"] == first.trajectory["agent"]


def said(message: AssistantMessage) -> tuple[Any, ...]:
    """What an answer says: its text, reasoning, and calls with their arguments as JSON values (a
    provider that carries them as an object keeps no spelling of them)."""
    calls = [(t.id, t.name, json.loads(t.arguments)) for t in message.tool_calls]
    return message.text, message.reasoning, calls


def _blob(run: Any, ref: Any) -> bytes:
    data: bytes = run.blobs[ref if isinstance(ref, str) else ref.blob]
    return data
