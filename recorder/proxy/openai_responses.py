"""OpenAI Responses (``POST /v1/responses``), JSON and SSE (also the WebSocket carriage's events).

Usage containment: ``input_tokens`` includes ``input_tokens_details.cached_tokens`` and
``output_tokens`` includes ``output_tokens_details.reasoning_tokens``.
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


def parse_request(body: Any) -> RequestInfo:
    info = RequestInfo()
    if not isinstance(body, dict):
        return info
    if body.get("type") == "response.create" and isinstance(body.get("response"), dict):
        body = body["response"]  # the WebSocket carriage may nest the request
    if body.get("type") == "response.create":
        body = {**body, "stream": True}  # over a WebSocket the answer is always a stream of events
    info.model = body.get("model") if isinstance(body.get("model"), str) else None
    info.stream = body.get("stream") is True
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
    return openai_usage(u, ("input", "output"), "input_tokens", "output_tokens")


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
            for part in (item.get("summary") or []) + (item.get("content") or []):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    r.reasoning.append(part["text"])
        elif kind in TOOL_CALL_TYPES:
            t = r.tool(i)
            t["id"], t["name"] = str(item.get("call_id", "")), str(item.get("name", ""))
            t["args"].append(str(item.get("arguments", item.get("input", ""))))


def parse_json(body: Any) -> Reassembled:
    r = Reassembled(complete=True)
    if not isinstance(body, dict):
        return r
    r.error = error_text(body)
    r.model = body.get("model")
    r.usage = usage(body.get("usage"))
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


def parse_stream(text: str) -> Reassembled:
    state = StreamState()
    for _event, data in iter_sse(text):
        event = loads(data)
        if isinstance(event, dict):
            state.feed(event)
    return state.result()
