"""OpenAI Chat Completions (``POST /v1/chat/completions``), JSON and SSE.

Usage containment: ``prompt_tokens`` already includes ``prompt_tokens_details.cached_tokens`` and
``completion_tokens`` includes ``completion_tokens_details.reasoning_tokens`` — our convention.
"""

from __future__ import annotations

from typing import Any

from recorder.proxy.result import (
    Pairing,
    Reassembled,
    RequestInfo,
    error_text,
    loads,
    openai_usage,
    reported_cost,
    text_of,
)
from recorder.proxy.wire import iter_sse
from schemas.events import Usage


def parse_request(body: Any) -> RequestInfo:
    info = RequestInfo()
    if not isinstance(body, dict):
        return info
    info.model = body.get("model") if isinstance(body.get("model"), str) else None
    info.stream = body.get("stream") is True
    messages: Any = body.get("messages")
    pairing = Pairing.of(info, messages)
    if pairing is None:
        return info
    for position, msg in enumerate(messages):
        if not isinstance(msg, dict):
            pairing.client()
            continue
        info.chars += len(text_of(msg.get("content")))
        if msg.get("role") == "assistant":
            asked = msg.get("tool_calls")
            calls = [
                (str(c.get("id") or ""), str(c["function"].get("name", "")), c["function"].get("arguments"))
                for c in (asked if isinstance(asked, list) else [])
                if isinstance(c, dict) and isinstance(c.get("function"), dict)
            ]
            pairing.model(position, calls)
        elif msg.get("role") == "tool":
            wire = msg.get("tool_call_id")
            pairing.result(position, str(wire) if wire else "", "", text_of(msg.get("content")), None)
        else:
            pairing.client()
    pairing.client()
    return info


def usage(u: Any) -> Usage | None:
    return openai_usage(u, ("prompt", "completion"), "prompt_tokens", "completion_tokens")


def parse_json(body: Any) -> Reassembled:
    r = Reassembled(complete=True)
    if not isinstance(body, dict):
        return r
    r.error = error_text(body)
    r.model = body.get("model")
    r.usage = usage(body.get("usage"))
    r.cost = reported_cost(body.get("usage"))
    choices = body.get("choices") or []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        msg = choice.get("message") or {}
        r.text.append(text_of(msg.get("content")))
        for key in ("reasoning_content", "reasoning"):
            if isinstance(msg.get(key), str):
                r.reasoning.append(msg[key])
        for i, call in enumerate(msg.get("tool_calls") or []):
            fn = call.get("function") or {}
            t = r.tool(i)
            t["id"], t["name"] = str(call.get("id", "")), str(fn.get("name", ""))
            t["args"].append(str(fn.get("arguments", "")))
        r.stop_reason = choice.get("finish_reason")
    return r


def parse_stream(text: str) -> Reassembled:
    r = Reassembled()
    for _event, data in iter_sse(text):
        if data.strip() == "[DONE]":
            r.complete = True
            continue
        chunk = loads(data)
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            r.error = error_text(chunk)
        r.model = chunk.get("model") or r.model
        if chunk.get("usage"):
            r.usage = usage(chunk["usage"])
            r.cost = reported_cost(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                r.text.append(delta["content"])
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    r.reasoning.append(delta[key])
            for call in delta.get("tool_calls") or []:
                t = r.tool(call.get("index", 0))
                if call.get("id"):
                    t["id"] = str(call["id"])
                fn = call.get("function") or {}
                if fn.get("name"):
                    t["name"] = str(fn["name"])
                if isinstance(fn.get("arguments"), str):
                    t["args"].append(fn["arguments"])
            if choice.get("finish_reason"):
                r.stop_reason = choice["finish_reason"]
    return r
