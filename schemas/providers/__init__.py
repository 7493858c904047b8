"""Everything the project knows about the model APIs it records, one module per API, and the
registry that picks the module for a request.

The proxy, the replay endpoint, the viewer, the importers, the exports and the judge's evidence all
read and build provider bodies through here, and nowhere else. Each module (``openai_chat``,
``openai_responses``, ``anthropic_messages``, ``gemini``) has the same parts:

- ``ITEMS`` (the key that holds a request's conversation, item by item), ``VOLATILE`` (keys a
  client changes in a conversation's earlier items without changing it), ``api_for(path)`` (the
  API a request path speaks);
- ``parse_request(body)`` → ``RequestInfo`` (model, stream flag, tool results, the conversation's
  items and model turns), ``parse_json(body, raw)`` and ``parse_stream(body)`` → ``Reassembled``
  (text, reasoning, tool calls, usage, stop reason), ``usage(obj)``;
- ``conversation(body)`` → ``Conversation`` (the request's messages in one shape for all);
- ``build_response(reply)``, ``build_stream(reply)``, ``error_body(status, message, kind)``.

Adding a provider is one such module and its ``Api`` entries in ``APIS`` below; the provider
contract suite (``tests/schemas/providers/test_contract.py``) runs every entry through the same
tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

from schemas.events import Usage
from schemas.providers import anthropic_messages, gemini, openai_chat, openai_responses
from schemas.providers.conversation import Conversation, Reply
from schemas.providers.result import Reassembled, RequestInfo, loads
from schemas.providers.wire import SSE_MEDIA

SYNTHETIC_MEDIA = "application/vnd.amb.synthetic+json"
"""The media type of a body amb made (an importer's request or response), not one a provider sent."""
CHARS_PER_TOKEN = 4
"""The usage estimate when a provider reports none (marked ``reported=False``)."""


@dataclass(frozen=True)
class Api:
    provider: str
    api: str
    """The name recorded in ``model_call.completed.api``."""
    module: ModuleType
    streams_by_path: bool = False
    """The method says the answer is a stream, not the body (``streamGenerateContent``)."""
    counts_tokens: bool = False
    """Nothing is generated: the history it carries is no turn of its conversation (``countTokens``)."""
    title: str = ""
    """Its name for people (``Anthropic Messages API``)."""


CHAT = Api("openai", "chat.completions", openai_chat, title="OpenAI Chat Completions API")
RESPONSES = Api("openai", "responses", openai_responses, title="OpenAI Responses API")
MESSAGES = Api("anthropic", "messages", anthropic_messages, title="Anthropic Messages API")
GENERATE = Api("gemini", "generateContent", gemini, title="Gemini API's generateContent")
STREAM_GENERATE = Api(
    "gemini",
    "streamGenerateContent",
    gemini,
    streams_by_path=True,
    title="Gemini API's streamGenerateContent",
)
COUNT_TOKENS = Api("gemini", "countTokens", gemini, counts_tokens=True, title="Gemini API's countTokens")
APIS = {a.api: a for a in (CHAT, RESPONSES, MESSAGES, GENERATE, STREAM_GENERATE, COUNT_TOKENS)}
"""Every API, by its recorded name."""
MODULES: dict[str, ModuleType] = {}
"""A module per provider, for what all its APIs share (the error shape its clients read)."""
for _api in APIS.values():
    MODULES.setdefault(_api.provider, _api.module)

CONVERSATION_KEYS = tuple(dict.fromkeys(a.module.ITEMS for a in APIS.values()))
"""Every key a request body may hold its conversation under."""

_AZURE_DEPLOYMENT = re.compile(r"/openai/deployments/([^/?]+)/")
_CLIENT_HEADERS = {"anthropic-version": "anthropic", "x-goog-api-key": "gemini"}
"""Headers only one provider's clients send (its API requires them)."""
_GEMINI_KEY = re.compile(r"[?&]key=")


def api_title(name: str) -> str:
    """The name for people of the API recorded as ``name`` (the recorded name when unknown)."""
    api = APIS.get(name)
    return api.title if api else f"{name} API"


def classify(method: str, path: str) -> Api | None:
    """The model API a request speaks, by its path (any prefix: ``/v1``, ``/openai/v1``,
    ``/openai/deployments/NAME``, ``/v1beta/models/MODEL:generateContent``, ...)."""
    if method != "POST":
        return None
    p = path.split("?", 1)[0].rstrip("/")
    for api in APIS.values():
        if api.module.api_for(p) == api.api:
            return api
    return None


def asked_by(path: str, header_names: Iterable[str] = ()) -> str | None:
    """The provider whose client sent a request (whichever its method): by the API its path
    speaks, else by a header only that provider's clients send (Anthropic's ``anthropic-version``,
    Google's ``x-goog-api-key``) or Google's ``key`` parameter; None when nothing says."""
    api = classify("POST", path)
    if api is not None:
        return api.provider
    sent = {name.lower() for name in header_names}
    by_header = next((p for header, p in _CLIENT_HEADERS.items() if header in sent), None)
    return by_header or ("gemini" if _GEMINI_KEY.search(path) else None)


def classify_websocket(path: str) -> Api | None:
    """A WebSocket carrying a model API (the Responses API's realtime-style carriage)."""
    return RESPONSES if classify("POST", path) is RESPONSES else None


def model_in_path(url: str) -> str | None:
    """The model a URL names: Gemini's ``models/MODEL:method``, an Azure deployment's name."""
    path = url.split("?", 1)[0]
    m = gemini.PATH.search(path) or _AZURE_DEPLOYMENT.search(path)
    return m.group(1) if m else None


def parse_request(api: Api, body: Any) -> RequestInfo:
    """The request's facts from its decoded JSON (what the API's path adds to the body included)."""
    info: RequestInfo = api.module.parse_request(body)
    if api.streams_by_path:
        info.stream = True
    elif api.counts_tokens:
        info.tool_results, info.items, info.model_turns = [], None, {}
    return info


def parse_response(api: Api, body: bytes, media_type: str) -> Reassembled:
    """The response reassembled from its decoded body: a stream of events, or one JSON body."""
    if SSE_MEDIA in media_type:
        return cast(Reassembled, api.module.parse_stream(body))
    parsed = loads(body)
    result: Reassembled = api.module.parse_json(parsed, body)
    result.complete = parsed is not None
    return result


def wants_stream(api: Api, body: Any) -> bool:
    """Whether a request asks for its answer as a stream."""
    return api.streams_by_path or (isinstance(body, dict) and body.get("stream") is True)


def conversation(api_name: str, body: Any) -> Conversation:
    """A request's conversation (empty for a body that is no JSON object). A body of an API the
    project does not know (an import's: Inspect keeps its own) is read by the shape it has."""
    if not isinstance(body, dict):
        return Conversation()
    api = APIS.get(api_name) or by_shape(body) or CHAT
    conv: Conversation = api.module.conversation(body)
    conv.model = body.get("model") if isinstance(body.get("model"), str) else None
    return conv


def by_shape(body: Any) -> Api | None:
    """The API a request body looks like it speaks, for a body kept without its path (an import's):
    by the key that holds its conversation, and Anthropic's top-level ``system``."""
    if not isinstance(body, dict):
        return None
    if "contents" in body:
        return GENERATE
    if "input" in body and "messages" not in body:
        return RESPONSES
    if "messages" in body:
        return MESSAGES if "system" in body or "anthropic_version" in body else CHAT
    return None


def build_response(api: Api, reply: Reply, stream: bool = False, path: str = "") -> bytes:
    """The body a provider answers ``reply`` with, whole or as its stream (as ``path`` asks)."""
    if stream:
        return cast(bytes, api.module.build_stream(reply, path))
    return json.dumps(api.module.build_response(reply), ensure_ascii=False).encode()


def reply_of(api: Api, body: bytes) -> Reply:
    """The answer a whole response body holds."""
    r = api.module.parse_json(loads(body), body)
    return Reply(r.message(), r.model, r.stop_reason, r.usage, r.response_id or "")


def as_recorded_stream(api_name: str, media: str, body: bytes, path: str) -> tuple[str, bytes]:
    """A streamed call's recorded response as the stream to send again: as it was recorded, or, for
    a whole body amb made (an import has no stream), the stream the provider sends for it."""
    api = APIS.get(api_name)
    if media != SYNTHETIC_MEDIA or api is None:
        return media, body
    data = build_response(api, reply_of(api, body), stream=True, path=path)
    return (SSE_MEDIA if not data.startswith(b"[") else "application/json"), data


def error_body(provider: str, status: int, message: str, kind: str) -> dict[str, Any]:
    """An error in the provider's own shape, so its SDK raises what it raises for the real thing."""
    return cast(dict[str, Any], MODULES.get(provider, openai_chat).error_body(status, message, kind))


def model_list(provider: str, models: dict[str, str]) -> dict[str, Any]:
    """``GET .../models`` in the provider's shape: ``models``, each with the provider that served it."""
    return cast(dict[str, Any], MODULES.get(provider, openai_chat).model_list(models))


def model_entry(provider: str, model: str, owner: str) -> dict[str, Any]:
    """``GET .../models/MODEL`` in the provider's shape."""
    return cast(dict[str, Any], MODULES.get(provider, openai_chat).model_entry(model, owner))


def estimate_usage(req: RequestInfo, result: Reassembled) -> Usage:
    out_chars = sum(map(len, result.text)) + sum(map(len, result.reasoning))
    out_chars += sum(len("".join(t["args"])) for t in result.tool_calls.values())
    return Usage(
        input_total=-(-req.chars // CHARS_PER_TOKEN),
        output=-(-out_chars // CHARS_PER_TOKEN),
        reported=False,
    )
