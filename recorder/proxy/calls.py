"""Which requests are model calls, and turning one call's bytes into the recorded facts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

from recorder.proxy import anthropic_messages, gemini, history, openai_chat, openai_responses
from recorder.proxy.result import Reassembled, RequestInfo, loads
from recorder.proxy.skim import skim
from recorder.proxy.wire import decode_content
from schemas.events import Usage

CHARS_PER_TOKEN = 4
"""The usage estimate when a provider reports none (marked ``reported=False``)."""


@dataclass(frozen=True)
class Api:
    provider: str
    api: str
    parser: ModuleType


CHAT = Api("openai", "chat.completions", openai_chat)
RESPONSES = Api("openai", "responses", openai_responses)
MESSAGES = Api("anthropic", "messages", anthropic_messages)
GENERATE = Api("gemini", "generateContent", gemini)
STREAM_GENERATE = Api("gemini", "streamGenerateContent", gemini)
COUNT_TOKENS = Api("gemini", "countTokens", gemini)
GEMINI_METHODS = {
    "generateContent": GENERATE,
    "streamGenerateContent": STREAM_GENERATE,
    "countTokens": COUNT_TOKENS,
}

VOLATILE = {"anthropic": ("cache_control",)}
"""Keys a provider's clients change in a conversation's earlier items without changing it."""

_GEMINI_PATH = re.compile(r"/(?:tunedM|m)odels/([^/:]+):(\w+)$")
_AZURE_DEPLOYMENT = re.compile(r"/openai/deployments/([^/?]+)/")


def classify(method: str, path: str) -> Api | None:
    """The model API a request speaks, by its path (any prefix: ``/v1``, ``/openai/v1``,
    ``/openai/deployments/NAME``, ``/v1beta/models/MODEL:generateContent``, ...)."""
    if method != "POST":
        return None
    p = path.split("?", 1)[0].rstrip("/")
    if ":" in p:
        m = _GEMINI_PATH.search(p)
        return GEMINI_METHODS.get(m.group(2)) if m else None
    if p.endswith("/chat/completions"):
        return CHAT
    if p.endswith("/responses"):
        return RESPONSES
    if p.endswith("/messages"):  # not /messages/count_tokens or /messages/batches
        return MESSAGES
    return None


def classify_websocket(path: str) -> Api | None:
    """A WebSocket carrying a model API (the Responses API's realtime-style carriage)."""
    p = path.split("?", 1)[0].rstrip("/")
    return RESPONSES if p.endswith("/responses") else None


def model_in_path(url: str) -> str | None:
    """The model a URL names: Gemini's ``models/MODEL:method``, an Azure deployment's name."""
    path = url.split("?", 1)[0]
    m = _GEMINI_PATH.search(path) or _AZURE_DEPLOYMENT.search(path)
    return m.group(1) if m else None


def parse_request(api: Api, body: bytes) -> RequestInfo:
    """The request's facts; a large body is parsed without its inline binary data (``skim``)."""
    info = _parse_request(api, body)
    if api is STREAM_GENERATE:
        info.stream = True  # the method says so, not the body
    elif api is COUNT_TOKENS:
        # A history sent to be counted is no turn of its conversation: it answers nothing (the next
        # call's request does) and nothing continues it.
        info.tool_results, info.chain, info.model_turns = [], [], {}
    return info


def _parse_request(api: Api, body: bytes) -> RequestInfo:
    if not body:
        return RequestInfo()
    skimmed = skim(body)
    if skimmed is not None:
        doc, marker = skimmed
        parsed = loads(doc)
        if parsed is not None:
            info = api.parser.parse_request(parsed)
            if not any(marker in r.output for r in info.tool_results):
                return chain_conversation(api, info, marker)
    return chain_conversation(api, api.parser.parse_request(loads(body)), None)


def chain_conversation(api: Api, info: RequestInfo, marker: str | None) -> RequestInfo:
    """``info`` with its conversation chained (``recorder.proxy.history``), its items let go."""
    items, info.items = info.items, None
    if items is not None:
        info.chain = history.chain(items, VOLATILE.get(api.provider, ()), marker)
    return info


def parse_response(
    api: Api, raw: bytes, encoding: str | None, content_type: str
) -> tuple[Reassembled, bytes, str | None]:
    """Reassemble a response from its wire bytes; returns (result, decoded body, decode error)."""
    body, err = decode_content(raw, encoding)
    if "text/event-stream" in content_type:
        result = api.parser.parse_stream(body.decode("utf-8", "replace"))
    else:
        parsed = loads(body)
        if api is MESSAGES:
            result = anthropic_messages.parse_json(parsed, body)
        elif api.parser is gemini:
            if parsed is None and api is STREAM_GENERATE:  # a JSON-array stream cut off
                result = gemini.parse_array_stream(body.decode("utf-8", "replace"))
            else:
                result = gemini.parse_json(parsed, body)
        else:
            result = api.parser.parse_json(parsed)
        result.complete = parsed is not None
    return result, body, err


def streams_json(api: Api) -> bool:
    """Whether the API streams a JSON body (Gemini's array stream) that must be passed on live."""
    return api is STREAM_GENERATE


def estimate_usage(req: RequestInfo, result: Reassembled) -> Usage:
    out_chars = sum(map(len, result.text)) + sum(map(len, result.reasoning))
    out_chars += sum(len("".join(t["args"])) for t in result.tool_calls.values())
    return Usage(
        input_total=-(-req.chars // CHARS_PER_TOKEN),
        output=-(-out_chars // CHARS_PER_TOKEN),
        reported=False,
    )
