"""Answers the proxy gives itself. A model call refused for the run's budget gets its provider's
own error for an exhausted quota (``schemas.providers``, kind ``quota``, status 429) with
``x-should-retry: false``, so the agent's SDK raises it at once (docs/recording.md, "Budgets").
Whatever else amb refuses (a blocked destination, a recording it cannot persist) is ``amb_error``.
"""

from __future__ import annotations

import json

from mitmproxy import http

from schemas.providers import error_body, openai_responses
from schemas.providers.result import QUOTA

STATUS = 429


def response(provider: str, message: str) -> http.Response:
    data = json.dumps(error_body(provider, STATUS, message, QUOTA)).encode()
    return http.Response.make(
        STATUS,
        data,
        {"content-type": "application/json", "x-should-retry": "false", "amb-budget": "exhausted"},
    )


def amb_error(status: int, message: str, code: str) -> http.Response:
    """An answer of amb's own (not a provider's): ``{"error": {"message", "type", "code"}}``."""
    body = json.dumps({"error": {"message": message, "type": code, "code": code}})
    return http.Response.make(status, body.encode(), {"content-type": "application/json"})


def websocket_error(message: str) -> bytes:
    """The Responses API's error event over a WebSocket (what its server sends for a failed request)."""
    return json.dumps(openai_responses.error_event(STATUS, message, QUOTA)).encode()
