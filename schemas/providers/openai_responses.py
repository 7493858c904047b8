"""OpenAI Responses (``POST …/responses``), JSON and SSE (also the WebSocket carriage's events).

Usage containment: ``input_tokens`` includes ``input_tokens_details.cached_tokens`` and
``output_tokens`` includes ``output_tokens_details.reasoning_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.events import Usage
from schemas.providers.conversation import Conversation, Kind, Message, Part, Reply, Tool
from schemas.providers.openai_chat import error_body, openai_usage, reported_cost
from schemas.providers.result import Pairing, Reassembled, RequestInfo, error_text, loads, text_of
from schemas.providers.wire import iter_sse, sse_body

ITEMS = "input"
VOLATILE: tuple[str, ...] = ()
__all__ = ["error_body"]  # the OpenAI error shape, as Chat Completions has it


def api_for(path: str) -> str | None:
    return "responses" if path.endswith("/responses") else None


TOOL_CALL_TYPES = ("function_call", "custom_tool_call")
TOOL_OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")
INPUT_ROLES = ("user", "system", "developer")


def _from_client(item: dict[str, Any]) -> bool:
    """Whether an input item is the client's (a message of its own, a tool's output), not one the
    model produced (its messages, reasoning and calls, which make up a model turn)."""
    kind = item.get("type")
    if isinstance(kind, str) and kind.endswith("_output"):
        return True
    return kind in (None, "message") and item.get("role") in INPUT_ROLES


def _unwrap(body: dict[str, Any]) -> dict[str, Any]:
    """The request a WebSocket message carries (it may nest it; its answer is always a stream)."""
    if body.get("type") == "response.create" and isinstance(body.get("response"), dict):
        body = body["response"]
    if body.get("type") == "response.create":
        body = {**body, "stream": True}
    return body


def parse_request(body: Any) -> RequestInfo:
    if not isinstance(body, dict):
        return RequestInfo()
    body = _unwrap(body)
    info = RequestInfo.of(body)
    info.chars += len(text_of(body.get("instructions")))
    previous = body.get("previous_response_id")
    info.previous = previous if isinstance(previous, str) and previous else None
    items = body.get("input")
    if isinstance(items, str):
        info.chars += len(items)
        Pairing.of(info, [items])  # a conversation of one message
        return info
    pairing = Pairing.of(info, items)
    if pairing is None:
        return info
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            pairing.client()
        elif not _from_client(item):
            calls = []
            if item.get("type") in TOOL_CALL_TYPES:
                cid, args = item.get("call_id"), item.get("arguments", item.get("input"))
                calls.append((str(cid) if cid else "", str(item.get("name", "")), args))
            else:
                info.chars += len(text_of(item.get("content")))
            pairing.model(position, calls)
        elif item.get("type") in TOOL_OUTPUT_TYPES:
            cid = item.get("call_id")
            pairing.result(position, str(cid) if cid else "", "", text_of(item.get("output")), None)
        else:
            pairing.client()
            info.chars += len(text_of(item.get("content")))
    pairing.client()
    return info


def usage(u: Any) -> Usage | None:
    return openai_usage(u, "input", "output")


def _response_id(resp: Any) -> str | None:
    rid = resp.get("id") if isinstance(resp, dict) else None
    return rid if isinstance(rid, str) and rid else None


def _stop(resp: dict[str, Any]) -> str | None:
    details = resp.get("incomplete_details")
    if isinstance(details, dict) and details.get("reason"):
        return str(details["reason"])
    status = resp.get("status")
    return str(status) if status else None


def _add_output(r: Reassembled, output: Any) -> None:
    for i, item in enumerate(output or []):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") in ("output_text", "refusal"):
                    r.text.append(str(part.get("text") or part.get("refusal") or ""))
        elif kind == "reasoning":
            r.reasoning += _reasoning_texts(item)
        elif kind in TOOL_CALL_TYPES:
            t = r.tool(i)
            t["id"], t["name"] = str(item.get("call_id", "")), str(item.get("name", ""))
            t["args"].append(str(item.get("arguments", item.get("input", ""))))


def _reasoning_texts(item: dict[str, Any]) -> list[str]:
    """A reasoning item's texts: its summary's, then its content's."""
    parts = (item.get("summary") or []) + (item.get("content") or [])
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]


def parse_json(body: Any, raw: bytes = b"") -> Reassembled:
    r = Reassembled.whole(body, usage)
    if not isinstance(body, dict):
        return r
    r.cost = reported_cost(body.get("usage"))
    r.stop_reason = _stop(body)
    r.response_id = _response_id(body)
    _add_output(r, body.get("output"))
    return r


class StreamState:
    """Folds Responses stream events one at a time (SSE here, WebSocket messages in the addon)."""

    def __init__(self) -> None:
        self.r = Reassembled()
        self.args_done: dict[Any, str] = {}

    def feed(self, event: dict[str, Any]) -> None:
        r = self.r
        kind = event.get("type", "")
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            r.text.append(str(event.get("delta", "")))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            r.reasoning.append(str(event.get("delta", "")))
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") in TOOL_CALL_TYPES:
                t = r.tool(event.get("output_index"))
                t["id"], t["name"] = str(item.get("call_id", "")), str(item.get("name", ""))
        elif kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            r.tool(event.get("output_index"))["args"].append(str(event.get("delta", "")))
        elif kind in ("response.function_call_arguments.done", "response.custom_tool_call_input.done"):
            done = event.get("arguments", event.get("input"))
            if isinstance(done, str):
                self.args_done[event.get("output_index")] = done
        elif kind in ("response.created", "response.in_progress"):
            resp = event.get("response") or {}
            r.model = resp.get("model") or r.model
            r.response_id = _response_id(resp) or r.response_id
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            resp = event.get("response") or {}
            r.model = resp.get("model") or r.model
            r.usage = usage(resp.get("usage")) or r.usage
            r.cost = reported_cost(resp.get("usage"))
            r.stop_reason = _stop(resp)
            if kind == "response.failed":
                r.error = error_text(resp) or "response.failed"
            r.complete = True
        elif kind == "error":
            r.error = str(event.get("message") or error_text(event) or "error")
            r.complete = True

    def result(self) -> Reassembled:
        for key, args in self.args_done.items():  # a stream that sent only the .done form
            t = self.r.tool(key)
            if not t["args"]:
                t["args"].append(args)
        return self.r


def parse_stream(body: bytes) -> Reassembled:
    state = StreamState()
    for _event, data in iter_sse(body):
        event = loads(data)
        if isinstance(event, dict):
            state.feed(event)
    return state.result()


def conversation(body: dict[str, Any]) -> Conversation:
    body = _unwrap(body)
    conv = Conversation(tools=Tool.listed(body.get("tools"), "parameters"))
    if body.get("instructions"):
        conv.messages.append(Message("system", _content(body["instructions"])))
    items = body.get("input")
    if isinstance(items, str):
        conv.messages.append(Message("user", Part.texts(items)))
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            conv.messages.append(_item(item))
    return conv


def _item(item: dict[str, Any]) -> Message:
    kind = item.get("type")
    if kind in TOOL_CALL_TYPES:
        args = item.get("arguments", item.get("input"))
        return Message("assistant", [Part.call(item.get("call_id"), item.get("name"), args)])
    if kind in TOOL_OUTPUT_TYPES:
        return Message("tool", [Part.result(text_of(item.get("output")), item.get("call_id"))])
    if kind == "reasoning":
        return Message("assistant", [Part(Kind.REASONING, t) for t in _reasoning_texts(item)])
    if kind in (None, "message"):
        return Message(str(item.get("role") or "user"), _content(item.get("content")))
    return Message("assistant" if not _from_client(item) else "user", [Part(Kind.OTHER, json.dumps(item))])


def _content(content: Any) -> list[Part]:
    if isinstance(content, str):
        return Part.texts(content)
    return [_content_part(p) for p in content if isinstance(p, dict)] if isinstance(content, list) else []


def _content_part(p: dict[str, Any]) -> Part:
    text = p.get("text", p.get("refusal"))
    if isinstance(text, str):
        return Part(Kind.TEXT, text)
    if p.get("type") == "input_image":
        return Part.image(p.get("image_url"))
    return Part(Kind.OTHER, json.dumps(p))


def wire_usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.input_total,
        "input_tokens_details": {"cached_tokens": u.cache_read},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.input_total + u.output,
    }


def build_response(reply: Reply) -> dict[str, Any]:
    done = reply.stop_reason in (None, "completed")
    return {
        "id": reply.id,
        "object": "response",
        "status": "completed" if done else "incomplete",
        "incomplete_details": None if done else {"reason": reply.stop_reason},
        "model": reply.model,
        "output": _input_items(Message("assistant", reply.parts())),
        "usage": wire_usage(reply.usage) if reply.usage is not None else None,
    }


def build_stream(reply: Reply, path: str = "") -> bytes:
    """The answer as the API streams it: ``response.created``, each output item added, its deltas
    and done, then ``response.completed`` (or ``.incomplete``) with the whole response."""
    whole = build_response(reply)
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": {**whole, "status": "in_progress", "output": [], "usage": None},
        }
    ]
    for i, item in enumerate(whole["output"]):
        events += _item_events(i, item)
    end = "response.completed" if whole["status"] == "completed" else "response.incomplete"
    events.append({"type": end, "response": whole})
    return sse_body([{**e, "sequence_number": n} for n, e in enumerate(events)], named=True)


_TEXT_DELTAS = {
    "reasoning": ("summary", "response.reasoning_summary_text.delta", "summary_index"),
    "message": ("content", "response.output_text.delta", "content_index"),
}
"""By output item type: the key of its texts, its delta event, the key that says which text."""


def _item_events(i: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    kind = item["type"]
    if kind in _TEXT_DELTAS:
        key, delta, index = _TEXT_DELTAS[kind]
        empty = {**item, key: []}
        deltas = [{"type": delta, "output_index": i, index: 0, "delta": item[key][0]["text"]}]
    else:
        args = item["arguments"]
        empty = {**item, "arguments": ""}
        deltas = [
            {"type": "response.function_call_arguments.delta", "output_index": i, "delta": args},
            {"type": "response.function_call_arguments.done", "output_index": i, "arguments": args},
        ]
    return [
        {"type": "response.output_item.added", "output_index": i, "item": empty},
        *deltas,
        {"type": "response.output_item.done", "output_index": i, "item": item},
    ]


def error_event(status: int, message: str, kind: str) -> dict[str, Any]:
    """The error event a Responses WebSocket sends for a request that failed."""
    return {"type": "error", "status": status, **error_body(status, message, kind)}


def build_request(conv: Conversation, stream: bool = False) -> dict[str, Any]:
    """A request carrying ``conv`` (an importer's synthetic request)."""
    body: dict[str, Any] = {"model": conv.model}
    if conv.system() is not None:
        body["instructions"] = conv.system()
    body["input"] = [item for m in conv.rest() for item in _input_items(m)]
    body["tools"] = [
        {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
        for t in conv.tools
    ]
    if stream:
        body["stream"] = True
    return body


def _input_items(m: Message) -> list[dict[str, Any]]:
    """One message as input items: its reasoning, its text and images, its calls, its results."""
    said = "output_text" if m.role == "assistant" else "input_text"
    content = [
        {"type": said, "text": p.text}
        if p.kind == Kind.TEXT
        else {"type": "input_image", "image_url": p.data_url or p.url}
        for p in m.parts
        if p.kind in (Kind.TEXT, Kind.IMAGE)
    ]
    items: list[dict[str, Any]] = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": p.text}]}
        for p in m.parts
        if p.kind == Kind.REASONING
    ]
    if content or not m.parts:
        items.append({"type": "message", "role": m.role, "content": content})
    for p in m.parts:
        if p.kind == Kind.TOOL_CALL:
            items.append({"type": "function_call", "call_id": p.id, "name": p.name, "arguments": p.arguments})
        elif p.kind == Kind.TOOL_RESULT:
            items.append({"type": "function_call_output", "call_id": p.id, "output": p.text})
    return items
