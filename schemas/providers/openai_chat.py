"""OpenAI Chat Completions (``POST …/chat/completions``, also Azure's deployments and every
OpenAI-compatible gateway), JSON and SSE.

Usage containment: ``prompt_tokens`` already includes ``prompt_tokens_details.cached_tokens`` and
``completion_tokens`` includes ``completion_tokens_details.reasoning_tokens`` — our convention.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.events import Usage
from schemas.providers.conversation import Conversation, Kind, Message, Part, Reply, Tool
from schemas.providers.result import Pairing, Reassembled, RequestInfo, as_int, error_text, loads, text_of
from schemas.providers.wire import iter_sse, sse_body

ITEMS = "messages"
VOLATILE: tuple[str, ...] = ()
STREAM_PIECE = 40
"""Characters of text per chunk of a built stream (the real API sends a few tokens a chunk)."""


def api_for(path: str) -> str | None:
    return "chat.completions" if path.endswith("/chat/completions") else None


CACHE_READ_SPELLINGS = ("prompt_cache_hit_tokens", "cached_tokens", "cache_read_input_tokens")
"""Where OpenAI-compatible providers put cached input outside ``*_tokens_details.cached_tokens``:
DeepSeek, Moonshot, and gateways that pass Anthropic's name through. All inside the prompt total."""


def _first_int(*sources: tuple[Any, str]) -> int:
    for obj, key in sources:
        if isinstance(obj, dict) and key in obj:
            return as_int(obj[key])
    return 0


def openai_usage(u: Any, inputs: str, outputs: str) -> Usage | None:
    """OpenAI usage in the containment convention (cached inside input, reasoning inside output),
    its counts named ``{inputs}_tokens`` and ``{outputs}_tokens`` (Chat Completions says ``prompt``
    and ``completion`` where Responses says ``input`` and ``output``). Cached tokens are read under
    every spelling OpenAI-compatible providers use; cache writes where OpenRouter reports them."""
    if not isinstance(u, dict):
        return None
    idt = u.get(f"{inputs}_tokens_details")
    odt = u.get(f"{outputs}_tokens_details")
    return Usage(
        input_total=as_int(u.get(f"{inputs}_tokens")),
        cache_read=_first_int((idt, "cached_tokens"), *((u, k) for k in CACHE_READ_SPELLINGS)),
        cache_write=_first_int((idt, "cache_write_tokens"), (u, "cache_creation_input_tokens")),
        output=as_int(u.get(f"{outputs}_tokens")),
        reasoning=_first_int((odt, "reasoning_tokens"), (u, "reasoning_tokens")),
    )


def reported_cost(u: Any) -> float | None:
    """The call's cost as a gateway reports it in the usage object (OpenRouter: ``cost``, USD)."""
    if isinstance(u, dict):
        cost = u.get("cost")
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            return float(cost)
    return None


def parse_request(body: Any) -> RequestInfo:
    info = RequestInfo.of(body)
    if not isinstance(body, dict):
        return info
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
    return openai_usage(u, "prompt", "completion")


_REASONING = ("reasoning_content", "reasoning")
"""Where OpenAI-compatible providers put a message's reasoning text (DeepSeek, OpenRouter)."""


def parse_json(body: Any, raw: bytes = b"") -> Reassembled:
    r = Reassembled.whole(body, usage)
    if not isinstance(body, dict):
        return r
    r.cost = reported_cost(body.get("usage"))
    choices = body.get("choices") or []
    if choices and isinstance(choices[0], dict):
        choice = choices[0]
        msg = choice.get("message") or {}
        r.text.append(text_of(msg.get("content")))
        r.reasoning += [msg[k] for k in _REASONING if isinstance(msg.get(k), str)]
        for i, call in enumerate(msg.get("tool_calls") or []):
            fn = call.get("function") or {}
            t = r.tool(i)
            t["id"], t["name"] = str(call.get("id", "")), str(fn.get("name", ""))
            t["args"].append(str(fn.get("arguments", "")))
        r.stop_reason = choice.get("finish_reason")
    return r


def parse_stream(body: bytes) -> Reassembled:
    r = Reassembled()
    for _event, data in iter_sse(body):
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
            r.reasoning += [delta[k] for k in _REASONING if isinstance(delta.get(k), str)]
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


def conversation(body: dict[str, Any]) -> Conversation:
    messages = [_message(m) for m in body.get("messages") or [] if isinstance(m, dict)]
    return Conversation(messages, tools_of(body.get("tools")))


def tools_of(entries: Any) -> list[Tool]:
    """Tools in OpenAI's function-calling shape (``{"type": "function", "function": {...}}``)."""
    functions = (
        [t.get("function") for t in entries if isinstance(t, dict)] if isinstance(entries, list) else []
    )
    return Tool.listed(functions, "parameters")


def _message(m: dict[str, Any]) -> Message:
    role = str(m.get("role") or "?")
    parts = content_parts(m.get("content"))
    if role == "tool":
        wire = m.get("tool_call_id")
        text = "\n".join(p.text for p in parts if p.kind == Kind.TEXT)
        return Message(role, [Part.result(text, wire)])
    if isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
        parts.insert(0, Part(Kind.REASONING, m["reasoning_content"]))
    for c in m.get("tool_calls") or []:
        if isinstance(c, dict) and isinstance(c.get("function"), dict):
            fn = c["function"]
            parts.append(Part.call(c.get("id"), fn.get("name"), fn.get("arguments")))
    return Message(role, parts)


def content_parts(content: Any) -> list[Part]:
    """A Chat Completions content: a string, or a list of text, image, audio and file parts."""
    if isinstance(content, str):
        return [Part(Kind.TEXT, content)] if content else []
    parts: list[Part] = []
    for item in content if isinstance(content, list) else []:
        if isinstance(item, str):
            parts.append(Part(Kind.TEXT, item))
        elif not isinstance(item, dict):
            continue
        elif isinstance(item.get("text"), str):
            parts.append(Part(Kind.TEXT, item["text"]))
        elif item.get("type") == "image_url":
            url = item.get("image_url")
            parts.append(Part.image(url.get("url") if isinstance(url, dict) else url))
        else:
            parts.append(Part(Kind.OTHER, json.dumps(item)))
    return parts


def build_request(conv: Conversation, stream: bool = False) -> dict[str, Any]:
    """A request carrying ``conv`` (an importer's synthetic request)."""
    body: dict[str, Any] = {
        "model": conv.model,
        "messages": [m for msg in conv.messages for m in _wire_messages(msg)],
        "tools": [tool_entry(t) for t in conv.tools],
    }
    if stream:
        body["stream"] = True
    return body


def _wire_messages(msg: Message) -> list[dict[str, Any]]:
    """One message as Chat Completions messages (each tool result is a message of its own)."""
    results = [p for p in msg.parts if p.kind == Kind.TOOL_RESULT]
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": p.id, "content": p.text} for p in results]
    if len(results) < len(msg.parts) or not results:
        out.insert(0, _wire_message(msg.role, msg.parts))
    return out


def _wire_message(role: str, parts: list[Part]) -> dict[str, Any]:
    """A message's text and images as its content, its reasoning and its calls beside them."""
    shown = [p for p in parts if p.kind in (Kind.TEXT, Kind.IMAGE)]
    content: Any = [_wire_part(p) for p in shown]
    if all(p.kind == Kind.TEXT for p in shown):
        content = "\n".join(p.text for p in shown) or (None if role == "assistant" else "")
    out: dict[str, Any] = {"role": role, "content": content}
    reasoning = "".join(p.text for p in parts if p.kind == Kind.REASONING)
    if reasoning:
        out["reasoning_content"] = reasoning
    calls = [
        {"id": p.id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}}
        for p in parts
        if p.kind == Kind.TOOL_CALL
    ]
    if calls:
        out["tool_calls"] = calls
    return out


def _wire_part(p: Part) -> dict[str, Any]:
    if p.kind == Kind.IMAGE:
        return {"type": "image_url", "image_url": {"url": p.data_url or p.url}}
    return {"type": "text", "text": p.text}


def tool_entry(t: Tool) -> dict[str, Any]:
    """A tool as Chat Completions offers it (OpenAI's function-calling shape, also ATIF's)."""
    fn: dict[str, Any] = {"name": t.name}
    if t.description:
        fn["description"] = t.description
    if t.parameters is not None:
        fn["parameters"] = t.parameters
    return {"type": "function", "function": fn}


def wire_usage(u: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": u.input_total, "completion_tokens": u.output}
    if u.cache_read or u.cache_write:
        out["prompt_tokens_details"] = {"cached_tokens": u.cache_read, "cache_write_tokens": u.cache_write}
    if u.reasoning:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning}
    return out


def build_response(reply: Reply) -> dict[str, Any]:
    message = _wire_message("assistant", reply.parts())
    body: dict[str, Any] = {
        "id": reply.id,
        "object": "chat.completion",
        "model": reply.model,
        "choices": [{"index": 0, "finish_reason": reply.stop_reason, "message": message}],
    }
    if reply.usage is not None:
        body["usage"] = wire_usage(reply.usage)
    return body


def build_stream(reply: Reply, path: str = "") -> bytes:
    """The answer as the API streams it: a role chunk, text and reasoning deltas, each tool call's
    header then its arguments, the finish reason, the usage chunk, ``[DONE]``."""
    msg = reply.message
    base = {"id": reply.id, "object": "chat.completion.chunk", "model": reply.model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": p}) for p in _pieces(msg.reasoning)]
    chunks += [chunk({"content": p}) for p in _pieces(msg.text)]
    for k, t in enumerate(msg.tool_calls):
        head = {"index": k, "id": t.id, "type": "function", "function": {"name": t.name, "arguments": ""}}
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [
            chunk({"tool_calls": [{"index": k, "function": {"arguments": p}}]}) for p in _pieces(t.arguments)
        ]
    chunks.append(chunk({}, reply.stop_reason))
    if reply.usage is not None:
        chunks.append({**base, "choices": [], "usage": wire_usage(reply.usage)})
    return sse_body(chunks) + b"data: [DONE]\n\n"


def _pieces(text: str) -> list[str]:
    return [text[i : i + STREAM_PIECE] for i in range(0, len(text), STREAM_PIECE)]


ERROR_CODES = {"quota": "insufficient_quota", "invalid_request": "invalid_request_error"}
"""OpenAI's names of the errors amb answers with (``result.QUOTA`` ...; others keep their own)."""


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    """OpenAI's error body (also what OpenAI-compatible gateways send)."""
    code = ERROR_CODES.get(kind, kind)
    return {"error": {"message": message, "type": code, "param": None, "code": code}}


def model_list(models: dict[str, str]) -> dict[str, Any]:
    """``GET /models``: each model by name with the provider that served it."""
    return {"object": "list", "data": [model_entry(m, owner) for m, owner in models.items()]}


def model_entry(model: str, owner: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": owner}
