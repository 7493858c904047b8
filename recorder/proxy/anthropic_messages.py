"""Anthropic Messages (``POST /v1/messages``), JSON and SSE.

Usage containment: Anthropic reports ``input_tokens`` WITHOUT the cached part, beside
``cache_read_input_tokens`` and ``cache_creation_input_tokens``; ``input_total`` is their sum.
Thinking tokens are not reported separately (they are inside ``output_tokens``): reasoning = 0.
"""

from __future__ import annotations

from typing import Any

import msgspec

from recorder.proxy.result import Pairing, Reassembled, RequestInfo, as_int, error_text, loads, text_of
from recorder.proxy.wire import iter_sse
from schemas.events import Usage


def parse_request(body: Any) -> RequestInfo:
    info = RequestInfo()
    if not isinstance(body, dict):
        return info
    info.model = body.get("model") if isinstance(body.get("model"), str) else None
    info.stream = body.get("stream") is True
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
    cache_read = (
        as_int(u.get("cache_read_input_tokens"))
        if "cache_read_input_tokens" in u
        else (prior.cache_read if prior else 0)
    )
    cache_write = (
        as_int(u.get("cache_creation_input_tokens"))
        if "cache_creation_input_tokens" in u
        else (prior.cache_write if prior else 0)
    )
    if "input_tokens" in u:
        input_total = as_int(u.get("input_tokens")) + cache_read + cache_write
    else:
        input_total = prior.input_total if prior else 0
    output = as_int(u.get("output_tokens")) if "output_tokens" in u else (prior.output if prior else 0)
    return Usage(input_total=input_total, cache_read=cache_read, cache_write=cache_write, output=output)


class _Block(msgspec.Struct):
    type: str = ""
    input: msgspec.Raw = msgspec.Raw(b"")


class _Body(msgspec.Struct):
    content: list[_Block] = []


_raw_decoder = msgspec.json.Decoder(_Body)


def parse_json(body: Any, raw: bytes = b"") -> Reassembled:
    r = Reassembled(complete=True)
    if not isinstance(body, dict):
        return r
    r.error = error_text(body)
    r.model = body.get("model")
    r.usage = usage(body.get("usage"))
    r.stop_reason = body.get("stop_reason")
    raw_inputs: list[bytes] = []
    try:  # the tool input exactly as the bytes on the wire, not a re-encoding of it
        raw_inputs = [bytes(b.input) for b in _raw_decoder.decode(raw).content] if raw else []
    except msgspec.DecodeError:
        pass
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


def parse_stream(text: str) -> Reassembled:
    r = Reassembled()
    for _event, data in iter_sse(text):
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
