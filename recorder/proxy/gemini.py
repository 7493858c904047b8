"""Google's Gemini API (``POST …/models/MODEL:generateContent``, ``:streamGenerateContent``,
``:countTokens``): JSON, SSE (``?alt=sse``) and the JSON-array stream (no ``alt``).

The REST API speaks camelCase (``inlineData``, ``functionCall``); the same fields in snake_case are
accepted too, as Google's servers do.

Usage containment (``usageMetadata``): ``promptTokenCount`` includes ``cachedContentTokenCount``;
``candidatesTokenCount`` does NOT include ``thoughtsTokenCount``, so output = candidates + thoughts
and reasoning = thoughts; ``toolUsePromptTokenCount`` (input the model read from tools it ran
itself) is input.

Function calls usually come without ids, and a client then makes up its own for the next request
(the Gemini CLI sends ``write_file_<time>_0``): the ids calls are recorded under, and which call a
function response answers, are the tool-call ledger's (``recorder.proxy.ledger``). This parser
gives it the conversation (``contents``, item by item) and, for each function response, the call it
answers among the request's own model turns (``result.Pairing``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from recorder.proxy.result import Pairing, Reassembled, RequestInfo, as_int, error_text, loads, text_of
from recorder.proxy.wire import iter_sse
from schemas.events import Usage


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


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
    pairing = Pairing.of(info, contents)
    if pairing is None:
        return info
    for position, content in enumerate(contents):
        if not isinstance(content, dict):
            pairing.client()
            continue
        calls: list[tuple[str, str, Any]] = []
        if content.get("role") != "model":
            pairing.client()
        parts = content.get("parts")
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                continue
            fc = _get(part, "functionCall", "function_call")
            fr = _get(part, "functionResponse", "function_response")
            if isinstance(fc, dict):
                calls.append((str(fc.get("id") or ""), str(fc.get("name", "")), fc.get("args")))
            elif isinstance(fr, dict):
                response = fr.get("response")
                pairing.result(
                    position,
                    str(fr.get("id") or ""),
                    str(fr.get("name") or ""),
                    _response_text(response),
                    _is_error(response),
                )
            elif isinstance(part.get("text"), str):
                info.chars += len(part["text"])
        if content.get("role") == "model":
            pairing.model(position, calls)
    pairing.client()
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
