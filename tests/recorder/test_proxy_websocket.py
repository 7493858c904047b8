"""The Responses API carried over a WebSocket (as the Codex CLI tries first): recorded message
by message, one model_call.completed per response.create, with the placeholder key swapped."""

from __future__ import annotations

import json
import socket

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from schemas.events import ModelCallCompleted, ToolCallRequested
from tests.fakes.harness import REAL_KEYS, Recording
from tests.fakes.upstream import TEXT, TOOL_ARGS, FakeUpstream


class WsClient:
    """A minimal blocking WebSocket client (wsproto over a socket)."""

    def __init__(self, port: int, path: str, headers: list[tuple[str, str]]):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(
            self.conn.send(
                Request(
                    host=f"127.0.0.1:{port}",
                    target=path,
                    extra_headers=[(k.encode(), v.encode()) for k, v in headers],
                )
            )
        )
        self.pending: list = []
        assert isinstance(self._next(), AcceptConnection)

    def _next(self):
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.conn.receive_data(data)
            self.pending.extend(self.conn.events())
        return self.pending.pop(0)

    def send(self, obj: dict) -> None:
        self.sock.sendall(self.conn.send(TextMessage(data=json.dumps(obj))))

    def until(self, kind: str) -> list[dict]:
        got, text = [], ""
        while True:
            ev = self._next()
            if isinstance(ev, TextMessage):
                text += ev.data
                if ev.message_finished:
                    got.append(json.loads(text))
                    text = ""
                    if got[-1]["type"] == kind:
                        return got

    def close(self) -> None:
        self.sock.sendall(self.conn.send(CloseConnection(code=1000)))
        self.sock.close()


@pytest.fixture
def rec(tmp_path):
    with FakeUpstream() as fake:
        r = Recording(tmp_path, fake.url).start()
        r.fake = fake  # type: ignore[attr-defined]  # the tests below reach the upstream through the recording
        yield r
        r.stop()


def test_two_responses_over_one_websocket(rec):
    auth = [("authorization", "Bearer " + rec.custody.placeholders["openai"])]
    ws = WsClient(rec.proxy.ports["openai"], "/v1/responses", auth)
    tools = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
    ws.send({"type": "response.create", "model": "codex-test", "input": "hi", "tools": tools})
    first = ws.until("response.completed")
    ws.send({"type": "response.create", "model": "codex-test", "input": "again"})
    second = ws.until("response.completed")
    ws.close()
    payloads = rec.new_payloads("model_call.completed", wait_for=2)
    calls = [p for p in payloads if isinstance(p, ModelCallCompleted)]
    assert len(calls) == 2 and calls[0].call_id != calls[1].call_id
    for call, got in zip(calls, (first, second), strict=False):
        client_text = "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta")
        assert (call.api, call.stream, call.ok, call.model) == ("responses", True, True, "codex-test")
        assert call.url.startswith("ws://") and call.message.text == client_text == TEXT
        assert call.usage.input_total == 200 and call.ttfb_ms is not None
        stored = rec.blobs.get(call.response).decode()
        assert stored.count("data: ") == len(got)  # every message, in order
    (tool,) = [p for p in payloads if isinstance(p, ToolCallRequested)]
    assert json.loads(tool.arguments) == TOOL_ARGS and tool.model_call_id == calls[0].call_id
    assert json.loads(rec.blobs.get(calls[1].request))["input"] == "again"
    upgrade = [r for r in rec.fake.requests if r.method == "GET" and r.path == "/v1/responses"]
    assert upgrade[-1].headers["authorization"] == "Bearer " + REAL_KEYS["OPENAI_API_KEY"]


def test_websocket_closed_mid_response_is_a_partial_record(rec):
    ws = WsClient(
        rec.proxy.ports["openai"], "/v1/responses", [("x-fake-delay-ms", "50"), ("x-fake-chunks", "20")]
    )
    ws.send({"type": "response.create", "model": "m", "input": "hi"})
    ws.until("response.output_text.delta")
    ws.sock.close()  # gone without a close frame, mid-response
    payloads = rec.new_payloads("model_call.completed")
    (call,) = [p for p in payloads if isinstance(p, ModelCallCompleted)]
    assert call.error is not None
    assert (call.ok, call.partial) == (False, True) and call.error.startswith("websocket_closed")
    assert call.message.text and TEXT.startswith(call.message.text) and call.message.text != TEXT
