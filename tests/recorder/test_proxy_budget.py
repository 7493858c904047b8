"""The budget through the real proxy for the carriages the SDK tests do not drive: the Gemini API
(Google's quota error) and the Responses API over a WebSocket (its error event). Past the limit
nothing reaches the fake upstream, and each refusal is recorded."""

from __future__ import annotations

import httpx
import pytest

from recorder.budget import Budget
from schemas.events import BudgetLimits, ModelCallCompleted
from tests.fakes.harness import Recording
from tests.fakes.upstream import FakeUpstream
from tests.recorder.test_proxy_websocket import WsClient


@pytest.fixture
def rec(tmp_path):
    with FakeUpstream() as fake:
        r = Recording(tmp_path, fake.url, budget=Budget(BudgetLimits(max_calls=1))).start()
        r.fake = fake  # type: ignore[attr-defined]  # the tests count what reached the upstream
        yield r
        r.stop()


def model_calls(rec: Recording, n: int) -> list[ModelCallCompleted]:
    return [
        p for p in rec.new_payloads("model_call.completed", wait_for=n) if isinstance(p, ModelCallCompleted)
    ]


def test_gemini_gets_googles_quota_error(rec):
    url = rec.endpoint("gemini") + "/v1beta/models/gemini-3.1-pro:generateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    headers = {"x-goog-api-key": rec.custody.placeholders["gemini"]}
    assert httpx.post(url, json=body, headers=headers, timeout=30).status_code == 200
    refused = httpx.post(url.replace("generateContent", "streamGenerateContent"), json=body, headers=headers)
    assert refused.status_code == 429 and refused.headers["x-should-retry"] == "false"
    error = refused.json()["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED" and "--max-calls 1 reached" in error["message"]
    assert len([r for r in rec.fake.requests if r.method == "POST"]) == 1  # nothing after the limit
    first, second = model_calls(rec, 2)
    assert first.ok and not second.ok and second.status == 429
    assert second.error is not None and second.error.startswith("budget_exceeded: ")
    assert second.usage.input_total == 0 and second.usage.reported  # never sent: nothing estimated


def test_websocket_response_create_gets_an_error_event(rec):
    ws = WsClient(rec.proxy.ports["openai"], "/v1/responses", [])
    ws.send({"type": "response.create", "model": "gpt-5.4", "input": "hi"})
    ws.until("response.completed")
    ws.send({"type": "response.create", "model": "gpt-5.4", "input": "again"})
    (error,) = ws.until("error")
    ws.close()
    assert error["status"] == 429 and error["error"]["code"] == "insufficient_quota"
    assert "budget is exhausted" in error["error"]["message"]
    creates = [r for r in rec.fake.requests if r.method == "WS" and b"response.create" in r.body]
    assert len(creates) == 1  # the second never reached the upstream
    first, second = model_calls(rec, 2)
    assert first.ok and not second.ok and not second.partial
    assert second.error is not None and second.error.startswith("budget_exceeded: ")
