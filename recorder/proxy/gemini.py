"""Google's Gemini API (``POST …/models/MODEL:generateContent``, ``:streamGenerateContent``,
``:countTokens``): JSON, SSE (``?alt=sse``) and the JSON-array stream (no ``alt``).

The REST API speaks camelCase (``inlineData``, ``functionCall``); the same fields in snake_case are
accepted too, as Google's servers do.

Usage containment (``usageMetadata``): ``promptTokenCount`` includes ``cachedContentTokenCount``;
``candidatesTokenCount`` does NOT include ``thoughtsTokenCount``, so output = candidates + thoughts
and reasoning = thoughts; ``toolUsePromptTokenCount`` (input the model read from tools it ran
itself) is input.

Tool calls are given ids of their own, ``gemini-<conversation>-<turn>-<index>``: the conversation
is a digest of the first content (without inline data), the turn is the model turn's index in
``contents`` (for a response: the number of contents its request sent, which is where the client
puts that turn in its next request), and the index counts function calls within the turn. The ids
on the wire cannot be used: the API often sends none, and a client then makes up its own (the Gemini
CLI sends ``write_file_<time>_0`` in its next request), so the response and the next request would
disagree. A function response pairs with the call of the model turn before it that carries the same
wire id, else with the call in the same position (the API requires one response per call, in
order), else with the first call of that name.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from recorder.proxy.result import Reassembled, RequestInfo, ToolResult, as_int, error_text, loads, text_of
from recorder.proxy.wire import iter_sse
from schemas.events import Usage


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def conversation_id(contents: list[Any]) -> str:
    """A digest of the conversation's first content, inline data left out (a large body's parse has
    it skimmed out, so it must not count)."""
    first = contents[0] if contents else None
    if isinstance(first, dict):
        parts = first.get("parts")
        if isinstance(parts, list):
            first = {
                **first,
                "parts": [
                    {k: v for k, v in p.items() if k not in ("inlineData", "inline_data")}
                    if isinstance(p, dict)
                    else p
                    for p in parts
                ],
            }
    return hashlib.sha256(msgspec.json.encode(first, order="sorted")).hexdigest()[:12]


def call_id(conversation: str, turn: int, index: int) -> str:
    return f"gemini-{conversation}-{turn}-{index}"


def parse_request(body: Any) -> RequestInfo:
    info = RequestInfo()
    if not isinstance(body, dict):
        return info
    if isinstance(body.get("generateContentRequest"), dict):  # countTokens may wrap a whole request
        body = body["generateContentRequest"]
    info.model = body.get("model") if isinstance(body.get("model"), str) else None
    system = _get(body, "systemInstruction", "system_instruction")
    if isinstance(system, dict):
        info.chars += len(text_of(system.get("parts")))
    contents = body.get("contents")
    if not isinstance(contents, list):
        return info
    info.conversation = conversation_id(contents)
    info.turns = len(contents)
    previous: list[tuple[str, str, str]] = []  # (our id, name, wire id) of the last model turn's calls
    for turn, content in enumerate(contents):
        if not isinstance(content, dict):
            continue
        calls: list[tuple[str, str, str]] = []
        results: list[dict[str, Any]] = []
        for part in content.get("parts") or []:
            if not isinstance(part, dict):
                continue
            fc = _get(part, "functionCall", "function_call")
            fr = _get(part, "functionResponse", "function_response")
            if isinstance(fc, dict):
                ours = call_id(info.conversation, turn, len(calls))
                calls.append((ours, str(fc.get("name", "")), str(fc.get("id") or "")))
            elif isinstance(fr, dict):
                results.append(fr)
            elif isinstance(part.get("text"), str):
                info.chars += len(part["text"])
        for k, fr in enumerate(results):
            name, wire = str(fr.get("name", "")), str(fr.get("id") or "")
            match = next((c for c in previous if wire and c[2] == wire), None)
            if match is None and k < len(previous) and previous[k][1] == name:
                match = previous[k]
            match = match or next((c for c in previous if c[1] == name), None)
            tid = match[0] if match else call_id(info.conversation, turn, k)
            response = fr.get("response")
            info.tool_results.append(
                ToolResult(tid, _response_text(response), name or None, _is_error(response))
            )
        if calls:
            previous = calls
    return info


def _response_text(response: Any) -> str:
    """A function response's text: its ``output``/``result`` string if that is all it holds, else
    the JSON of the whole object (the Gemini CLI sends ``{"output": "..."}``)."""
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return text_of(response)


def _is_error(response: Any) -> bool | None:
    if isinstance(response, dict) and "error" in response:
        return True
    return None


def usage(u: Any) -> Usage | None:
    if not isinstance(u, dict):
        return None
    thoughts = as_int(u.get("thoughtsTokenCount"))
    return Usage(
        input_total=as_int(u.get("promptTokenCount")) + as_int(u.get("toolUsePromptTokenCount")),
        cache_read=as_int(u.get("cachedContentTokenCount")),
        output=as_int(u.get("candidatesTokenCount")) + thoughts,
        reasoning=thoughts,
    )


class _Call(msgspec.Struct):
    args: msgspec.Raw = msgspec.Raw(b"")


class _Part(msgspec.Struct, rename="camel"):
    function_call: _Call | None = None


class _Content(msgspec.Struct):
    parts: list[_Part] = []


class _Candidate(msgspec.Struct):
    content: _Content | None = None


class _Chunk(msgspec.Struct):
    candidates: list[_Candidate] = []


_raw_decoder = msgspec.json.Decoder(_Chunk)
_raw_array_decoder = msgspec.json.Decoder(list[_Chunk])


def _raw_args(chunk: _Chunk) -> list[bytes]:
    """The first candidate's function-call arguments exactly as the bytes on the wire."""
    if not chunk.candidates or chunk.candidates[0].content is None:
        return []
    return [bytes(p.function_call.args) for p in chunk.candidates[0].content.parts if p.function_call]


class _Fold:
    """Folds response chunks (one whole body, SSE events, or the JSON array's elements)."""

    def __init__(self) -> None:
        self.r = Reassembled()

    def feed(self, chunk: Any, raw_args: list[bytes]) -> None:
        r = self.r
        if not isinstance(chunk, dict):
            return
        if chunk.get("error"):
            r.error = error_text(chunk)
            r.complete = True
        r.model = chunk.get("modelVersion") or r.model
        r.usage = usage(chunk.get("usageMetadata")) or r.usage
        if "totalTokens" in chunk:  # countTokens: nothing was generated
            r.usage = Usage()
            r.complete = True
        feedback = chunk.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):  # the prompt was refused
            r.stop_reason = f"prompt_blocked: {feedback['blockReason']}"
            r.complete = True
        candidates = chunk.get("candidates") or []
        if not candidates or not isinstance(candidates[0], dict):
            return
        cand = candidates[0]
        n_raw = 0
        for part in (cand.get("content") or {}).get("parts") or []:
            if not isinstance(part, dict):
                continue
            fc = part.get("functionCall")
            if isinstance(fc, dict):
                t = r.tool(len(r.tool_calls))
                t["id"], t["name"] = str(fc.get("id") or ""), str(fc.get("name", ""))
                raw = raw_args[n_raw] if n_raw < len(raw_args) else b""
                n_raw += 1
                t["args"].append(raw.decode() if raw else msgspec.json.encode(fc.get("args", {})).decode())
            elif isinstance(part.get("text"), str):
                (r.reasoning if part.get("thought") is True else r.text).append(part["text"])
        if cand.get("finishReason"):
            r.stop_reason = str(cand["finishReason"])
            r.complete = True


def assign_ids(result: Reassembled, info: RequestInfo) -> None:
    """Give the response's function calls the ids their next request's parse will give them (see
    the module's docstring)."""
    for index, t in enumerate(result.tool_calls.values()):
        t["id"] = call_id(info.conversation or conversation_id([]), info.turns, index)


def parse_json(body: Any, raw: bytes = b"") -> Reassembled:
    """A whole body: one response, or the JSON-array stream of them."""
    fold = _Fold()
    if isinstance(body, list):
        raws: list[_Chunk] = []
        try:
            raws = _raw_array_decoder.decode(raw) if raw else []
        except msgspec.DecodeError:
            pass
        for i, chunk in enumerate(body):
            fold.feed(chunk, _raw_args(raws[i]) if i < len(raws) else [])
    else:
        try:
            raw_args = _raw_args(_raw_decoder.decode(raw)) if raw else []
        except msgspec.DecodeError:
            raw_args = []
        fold.feed(body, raw_args)
        fold.r.complete = body is not None
    return fold.r


def parse_array_stream(text: str) -> Reassembled:
    """A JSON-array stream that may be cut off: the elements that arrived whole."""
    body = loads(text)
    if isinstance(body, list):
        return parse_json(body, text.encode())
    fold = _Fold()
    for element in _complete_elements(text):
        try:
            raw_args = _raw_args(_raw_decoder.decode(element))
        except msgspec.DecodeError:
            raw_args = []
        fold.feed(loads(element), raw_args)
    fold.r.complete = False
    return fold.r


def _complete_elements(text: str) -> list[str]:
    """The top-level objects of a truncated JSON array, found by bracket depth outside strings."""
    out: list[str] = []
    depth, start, in_str, esc = 0, -1, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and start >= 0:
                out.append(text[start : i + 1])
    return out


def parse_stream(text: str) -> Reassembled:
    fold = _Fold()
    for _event, data in iter_sse(text):
        chunk = loads(data)
        try:
            raw_args = _raw_args(_raw_decoder.decode(data))
        except msgspec.DecodeError:
            raw_args = []
        fold.feed(chunk, raw_args)
    return fold.r
