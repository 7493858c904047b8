"""Anthropic Messages (``POST …/messages``), JSON and SSE.

Usage containment: Anthropic reports ``input_tokens`` WITHOUT the cached part, beside
``cache_read_input_tokens`` and ``cache_creation_input_tokens``; ``input_total`` is their sum.
Thinking tokens are not reported separately (they are inside ``output_tokens``): reasoning = 0.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgspec

from schemas.events import Usage
from schemas.providers.conversation import Conversation, Kind, Message, Part, Reply, Tool, args_object
from schemas.providers.result import Pairing, Reassembled, RequestInfo, as_int, error_text, loads, text_of
from schemas.providers.wire import iter_sse, sse_body

ITEMS = "messages"
VOLATILE = ("cache_control",)
"""Keys clients move between a conversation's items without changing it (onto the newest turn)."""


def api_for(path: str) -> str | None:
    return "messages" if path.endswith("/messages") else None  # not /messages/count_tokens, /batches


def parse_request(body: Any) -> RequestInfo:
    info = RequestInfo.of(body)
    if not isinstance(body, dict):
        return info
    info.chars += len(text_of(body.get("system")))
    messages: Any = body.get("messages")
    pairing = Pairing.of(info, messages)
    if pairing is None:
        return info
    for position, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") != "assistant":
            pairing.client()
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        if not isinstance(content, list):
            info.chars += len(text_of(content))
            continue
        calls: list[tuple[str, str, Any]] = []
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_use":
                calls.append((str(block.get("id") or ""), str(block.get("name", "")), block.get("input")))
            elif kind == "tool_result":
                wire, err = block.get("tool_use_id"), block.get("is_error")
                pairing.result(
                    position,
                    str(wire) if wire else "",
                    "",
                    text_of(block.get("content")),
                    err if isinstance(err, bool) else None,
                )
            else:
                info.chars += len(text_of(block.get("text")))
        if msg.get("role") == "assistant":
            pairing.model(position, calls)
    pairing.client()
    return info


def usage(u: Any, prior: Usage | None = None) -> Usage | None:
    """Normalise; ``prior`` carries message_start's input counts into message_delta's update."""
    if not isinstance(u, dict):
        return prior
    old = prior or Usage()

    def count(key: str, before: int) -> int:
        return as_int(u.get(key)) if key in u else before

    cache_read = count("cache_read_input_tokens", old.cache_read)
    cache_write = count("cache_creation_input_tokens", old.cache_write)
    input_total = old.input_total
    if "input_tokens" in u:
        input_total = as_int(u["input_tokens"]) + cache_read + cache_write
    output = count("output_tokens", old.output)
    return Usage(input_total=input_total, cache_read=cache_read, cache_write=cache_write, output=output)


class _Block(msgspec.Struct):
    type: str = ""
    input: msgspec.Raw = msgspec.Raw(b"")


class _Body(msgspec.Struct):
    content: list[_Block] = []


_raw_decoder = msgspec.json.Decoder(_Body)


def parse_json(body: Any, raw: bytes = b"") -> Reassembled:
    r = Reassembled.whole(body, usage)
    if not isinstance(body, dict):
        return r
    r.stop_reason = body.get("stop_reason")
    raw_inputs: list[bytes] = []
    # the tool input exactly as the bytes on the wire, not a re-encoding of it
    with contextlib.suppress(msgspec.DecodeError):
        raw_inputs = [bytes(b.input) for b in _raw_decoder.decode(raw).content]
    for i, block in enumerate(body.get("content") or []):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            r.text.append(str(block.get("text", "")))
        elif kind == "thinking":
            r.reasoning.append(str(block.get("thinking", "")))
        elif kind in ("tool_use", "server_tool_use"):
            t = r.tool(i)
            t["id"], t["name"] = str(block.get("id", "")), str(block.get("name", ""))
            arg = raw_inputs[i].decode() if i < len(raw_inputs) and raw_inputs[i] else None
            t["args"].append(arg if arg is not None else msgspec.json.encode(block.get("input", {})).decode())
    return r


def parse_stream(body: bytes) -> Reassembled:
    r = Reassembled()
    for _event, data in iter_sse(body):
        ev = loads(data)
        if not isinstance(ev, dict):
            continue
        kind = ev.get("type")
        if kind == "message_start":
            msg = ev.get("message") or {}
            r.model = msg.get("model")
            r.usage = usage(msg.get("usage"))
        elif kind == "content_block_start":
            block = ev.get("content_block") or {}
            if block.get("type") in ("tool_use", "server_tool_use"):
                t = r.tool(ev.get("index"))
                t["id"], t["name"] = str(block.get("id", "")), str(block.get("name", ""))
            elif block.get("type") == "text" and block.get("text"):
                r.text.append(str(block["text"]))
        elif kind == "content_block_delta":
            delta = ev.get("delta") or {}
            dk = delta.get("type")
            if dk == "text_delta":
                r.text.append(str(delta.get("text", "")))
            elif dk == "thinking_delta":
                r.reasoning.append(str(delta.get("thinking", "")))
            elif dk == "input_json_delta":
                r.tool(ev.get("index"))["args"].append(str(delta.get("partial_json", "")))
        elif kind == "message_delta":
            delta = ev.get("delta") or {}
            if delta.get("stop_reason"):
                r.stop_reason = delta["stop_reason"]
            r.usage = usage(ev.get("usage"), r.usage)
        elif kind == "message_stop":
            r.complete = True
        elif kind == "error":
            r.error = error_text(ev) or "error"
            r.complete = True
    for t in r.tool_calls.values():  # a tool_use with no input deltas has input {}
        if not t["args"]:
            t["args"].append("{}")
    return r


def conversation(body: dict[str, Any]) -> Conversation:
    conv = Conversation(tools=Tool.listed(body.get("tools"), "input_schema"))
    if body.get("system") is not None:
        conv.messages.append(Message("system", _blocks(body["system"])))
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            conv.messages.append(Message(str(m.get("role") or "?"), _blocks(m.get("content"))))
    return conv


def _blocks(content: Any) -> list[Part]:
    if isinstance(content, str):
        return Part.texts(content)
    parts: list[Part] = []
    for b in content if isinstance(content, list) else []:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if isinstance(b.get("text"), str):
            parts.append(Part(Kind.TEXT, b["text"]))
        elif kind == "thinking":
            parts.append(Part(Kind.REASONING, str(b.get("thinking") or "")))
        elif kind == "image" and isinstance(b.get("source"), dict):
            src = b["source"]
            parts.append(Part.image(src.get("url"), src.get("data"), src.get("media_type")))
        elif kind in ("tool_use", "server_tool_use"):
            parts.append(Part.call(b.get("id"), b.get("name"), b.get("input")))
        elif kind == "tool_result":
            parts.append(Part.result(text_of(b.get("content")), b.get("tool_use_id"), "", b.get("is_error")))
        else:
            parts.append(Part(Kind.OTHER, json.dumps(b)))
    return parts


def wire_usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.input_total - u.cache_read - u.cache_write,
        "cache_read_input_tokens": u.cache_read,
        "cache_creation_input_tokens": u.cache_write,
        "output_tokens": u.output,
    }


def build_response(reply: Reply) -> dict[str, Any]:
    return {
        "id": reply.id,
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [_wire_block(p) for p in reply.parts()],
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": wire_usage(reply.usage or Usage()),
    }


def build_stream(reply: Reply, path: str = "") -> bytes:
    """The answer as the API streams it: ``message_start``, each block's start, delta and stop,
    ``message_delta`` with the stop reason and output tokens, ``message_stop``."""
    whole = build_response(reply)
    start = {**whole, "content": [], "stop_reason": None, "usage": {**whole["usage"], "output_tokens": 0}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    calls = iter(reply.message.tool_calls)
    for i, block in enumerate(whole["content"]):
        args = args_object(next(calls).arguments)[1] if block["type"] == "tool_use" else ""
        events += _block_events(i, block, args)
    delta = {"stop_reason": reply.stop_reason, "stop_sequence": None}
    events.append(
        {"type": "message_delta", "delta": delta, "usage": {"output_tokens": whole["usage"]["output_tokens"]}}
    )
    events.append({"type": "message_stop"})
    return sse_body(events, named=True)


def _block_events(i: int, block: dict[str, Any], args: str) -> list[dict[str, Any]]:
    kind = block["type"]
    if kind == "thinking":
        empty, delta = {**block, "thinking": ""}, {"type": "thinking_delta", "thinking": block["thinking"]}
    elif kind == "text":
        empty, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
    else:
        empty, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": args}
    return [
        {"type": "content_block_start", "index": i, "content_block": empty},
        {"type": "content_block_delta", "index": i, "delta": delta},
        {"type": "content_block_stop", "index": i},
    ]


ERROR_TYPES = {
    "quota": "rate_limit_error",
    "invalid_request": "invalid_request_error",
    "not_found": "not_found_error",
}
"""Anthropic's names of the errors amb answers with (others keep their own)."""


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(kind, kind), "message": message}}


def model_list(models: dict[str, str]) -> dict[str, Any]:
    """``GET /v1/models``, one page holding every model (the provider that served each is not said)."""
    names = list(models)
    return {
        "data": [model_entry(m, owner) for m, owner in models.items()],
        "has_more": False,
        "first_id": names[0] if names else None,
        "last_id": names[-1] if names else None,
    }


def model_entry(model: str, owner: str) -> dict[str, Any]:
    return {"type": "model", "id": model, "display_name": model, "created_at": "1970-01-01T00:00:00Z"}


def build_request(conv: Conversation, stream: bool = False) -> dict[str, Any]:
    """A request carrying ``conv`` (an importer's synthetic request). A tool's results are the
    user's turn, as the API wants them."""
    body: dict[str, Any] = {"model": conv.model}
    if conv.system() is not None:
        body["system"] = conv.system()
    body["messages"] = [
        {
            "role": "assistant" if m.role == "assistant" else "user",
            "content": [_wire_block(p) for p in m.parts],
        }
        for m in conv.rest()
    ]
    body["tools"] = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in conv.tools
    ]
    if stream:
        body["stream"] = True
    return body


def _wire_block(p: Part) -> dict[str, Any]:
    if p.kind == Kind.REASONING:
        return {"type": "thinking", "thinking": p.text, "signature": ""}
    if p.kind == Kind.IMAGE and p.data_url:
        media, b64 = p.inline()
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": b64}}
    if p.kind == Kind.IMAGE:
        return {"type": "image", "source": {"type": "url", "url": p.url}}
    if p.kind == Kind.TOOL_CALL:
        return {"type": "tool_use", "id": p.id, "name": p.name, "input": args_object(p.arguments)[0]}
    if p.kind == Kind.TOOL_RESULT:
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": p.id, "content": p.text}
        if p.is_error is not None:
            result["is_error"] = p.is_error
        return result
    return {"type": "text", "text": p.text}
