"""The answer to a model call refused for the run's budget: each provider's own error for an exhausted
quota, so the agent's SDK raises the error it raises for the real thing, with amb's message in it.

- openai (Chat Completions, Responses; Azure and OpenAI-compatible gateways): 429,
  ``{"error": {"type": "insufficient_quota", "code": "insufficient_quota", ...}}`` (OpenAI's "You
  exceeded your current quota").
- anthropic: 429, ``{"type": "error", "error": {"type": "rate_limit_error", ...}}`` (Anthropic's
  spend limit).
- gemini: 429, ``{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", ...}}`` (Google's quota).

Every answer carries ``x-should-retry: false``, which the openai and anthropic SDKs obey: a refused
call is raised at once instead of being retried with back-off (a retry would be refused anyway).
"""

from __future__ import annotations

import json
from typing import Any

from mitmproxy import http

STATUS = 429


def body(provider: str, message: str) -> dict[str, Any]:
    if provider == "anthropic":
        return {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
    if provider == "gemini":
        return {"error": {"code": STATUS, "message": message, "status": "RESOURCE_EXHAUSTED"}}
    return {
        "error": {
            "message": message,
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }


def response(provider: str, message: str) -> http.Response:
    data = json.dumps(body(provider, message)).encode()
    return http.Response.make(
        STATUS,
        data,
        {"content-type": "application/json", "x-should-retry": "false", "amb-budget": "exhausted"},
    )


def websocket_error(message: str) -> bytes:
    """The Responses API's error event over a WebSocket (what its server sends for a failed request)."""
    return json.dumps(
        {
            "type": "error",
            "status": STATUS,
            "error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": message},
        }
    ).encode()
