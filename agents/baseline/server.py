"""An OpenAI-compatible model server on loopback whose "model" is the scripted baseline policy.

``POST /v1/chat/completions`` answers like the real API, non-streaming or as a server-sent event
stream (``stream: true``, with ``stream_options.include_usage``), with tool calls; ``GET /v1/models``
lists the models. The model name picks the policy's flaw: ``baseline`` is the clean policy,
``baseline+<flaw>`` (e.g. ``baseline+no-pilot``) injects one; a server started with a default flaw
applies it to plain ``baseline``. Token usage is estimated (4 characters a token), as a real server
would report it for the text it received and sent.

No API key is checked: the server binds loopback and answers whoever asks there, but only by a
loopback name (any other Host is refused with a 421, so a web page cannot reach it through DNS
rebinding). Every error, down to a malformed request line, is JSON in the API's shape. Every answer
is a deterministic function of the request, so a recorded run can be reproduced byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agents.baseline.context import Decision
from agents.baseline.policy import FLAWS, PolicyError, decide
from schemas import httpbase
from schemas.events import AssistantMessage, ToolCallPart, Usage
from schemas.providers import openai_chat
from schemas.providers.conversation import Reply
from schemas.providers.result import INVALID, NOT_FOUND
from schemas.providers.wire import sse_frames
from schemas.untrusted_json import loads_untrusted

MODEL = "baseline"
MAX_BODY = 64 * 1024 * 1024
"""The largest request body read: a conversation of thousands of turns fits many times over."""

STOP_POLL_S = 0.02
"""How often the serving loop looks for a stop request: ``stop()`` returns within this (the
standard library's 0.5 s default made every stop cost half a second)."""


def model_names() -> list[str]:
    return [MODEL] + [f"{MODEL}+{f}" for f in FLAWS]


def flaw_of(model: str, default: str | None) -> str | None:
    if model == MODEL:
        return default
    if model.startswith(MODEL + "+") and model[len(MODEL) + 1 :] in FLAWS:
        return model[len(MODEL) + 1 :]
    raise PolicyError(f"unknown model {model!r} (this server offers: {', '.join(model_names())})")


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def completion(body: dict, default_flaw: str | None = None) -> tuple[Reply, Decision]:
    """The answer to a request body (built into the API's response by ``schemas.providers``)."""
    model = str(body.get("model") or "")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PolicyError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise PolicyError(f"'messages[{i}]' must be an object, not {_json_type(m)}")
    if not isinstance(body.get("stream_options") or {}, dict):
        raise PolicyError(f"'stream_options' must be an object, not {_json_type(body['stream_options'])}")
    decision = decide(messages, flaw_of(model, default_flaw))
    # Seeds tool-call ids (not a stored digest): json.dumps takes whatever a client sends, which
    # the codec's canonical JSON may refuse (a lone surrogate), and keeps the ids of recorded runs.
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    calls = [
        ToolCallPart(id=f"call_{digest[:10]}_{turn}_{k}", name=tc.name, arguments=json.dumps(tc.arguments))
        for k, tc in enumerate(decision.tool_calls)
    ]
    prompt = _tokens(json.dumps(messages)) + (
        _tokens(json.dumps(body.get("tools"))) if body.get("tools") else 0
    )
    usage = Usage(input_total=prompt, output=_tokens(decision.content + "".join(c.arguments for c in calls)))
    message = AssistantMessage(text=decision.content, tool_calls=calls)
    stop = "tool_calls" if calls else "stop"
    return Reply(message, model, stop, usage, f"chatcmpl-{digest[:24]}"), decision


class _Handler(httpbase.Handler):
    server_version = "amb-baseline/1"
    default_flaw: str | None = None

    def _error(self, status: int, message: str, kind: str = INVALID) -> None:
        self.send_json(status, openai_chat.error_body(status, message, kind))

    def error_json(self, status: int, message: str) -> Any:
        return openai_chat.error_body(status, message, INVALID)

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            models = [{"id": m, "object": "model", "created": 0, "owned_by": "amb"} for m in model_names()]
            self.send_json(200, {"object": "list", "data": models})
        elif self.path == "/health":
            self.send_json(200, {"ok": True})
        else:
            self._error(404, f"no route {self.path}", NOT_FOUND)

    def do_POST(self) -> None:
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {self.path} (this server speaks /v1/chat/completions)", NOT_FOUND)
            return
        try:
            # (nested deeper than any decoder recurses: a ValueError, not a RecursionError)
            body = loads_untrusted(self.read_body(MAX_BODY) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            reply, _ = completion(body, self.default_flaw)
        except httpbase.BodyRefused as e:
            self._error(e.status, str(e))
            return
        except (ValueError, PolicyError) as e:
            self._error(400, str(e) if isinstance(e, PolicyError) else f"bad request body: {e}")
            return
        if not body.get("stream"):
            self.send_json(200, openai_chat.build_response(reply))
            return
        if not (body.get("stream_options") or {}).get("include_usage"):
            reply.usage = None
        self.send_chunks(200, "text/event-stream", sse_frames(openai_chat.build_stream(reply)), {})
        self.end_chunks()


class BaselineServer(httpbase.Serving):
    """The server on ``host:port`` (port 0 picks a free one) in a background thread; its ``url``
    (scheme://host:port) is what ``amb-record --upstream openai=URL`` takes."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, flaw: str | None = None):
        if flaw is not None and flaw not in FLAWS:
            raise PolicyError(f"unknown flaw {flaw!r} (known: {', '.join(FLAWS)})")
        names = httpbase.answered_names(host)  # (no DNS rebinding)
        super().__init__(_Handler, host, port, STOP_POLL_S, default_flaw=flaw, allowed_hosts=names)
