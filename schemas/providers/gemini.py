"""Google's Gemini API (``POST …/models/MODEL:generateContent``, ``:streamGenerateContent``,
``:countTokens``): JSON, SSE (``?alt=sse``) and the JSON-array stream (no ``alt``).

The REST API speaks camelCase (``inlineData``, ``functionCall``); the same fields in snake_case are
accepted too, as Google's servers do.

``candidatesTokenCount`` does NOT include ``thoughtsTokenCount`` (``usage``). Function calls
usually come without ids (a client makes up its own for the next request): the ids are the proxy's
tool-call ledger's, to which this parser gives the conversation and, for each function response,
the call it answers among the request's own model turns (``result.Pairing``).
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import msgspec

from schemas.events import Usage
from schemas.providers.conversation import Conversation, Kind, Message, Part, Reply, Tool, args_object
from schemas.providers.result import Pairing, Reassembled, RequestInfo, as_int, error_text, loads, text_of
from schemas.providers.wire import array_elements, iter_sse, sse_body

ITEMS = "contents"
VOLATILE: tuple[str, ...] = ()
METHODS = ("generateContent", "streamGenerateContent", "countTokens")
PATH = re.compile(r"/(?:tunedM|m)odels/([^/:]+):(\w+)$")
"""``…/models/MODEL:method`` (also Vertex AI's ``…/publishers/google/models/…`` and tuned models)."""
STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED"}
"""Google's status names by HTTP status (anything else is ``INTERNAL``)."""


def api_for(path: str) -> str | None:
    m = PATH.search(path)
    return m.group(2) if m and m.group(2) in METHODS else None


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _unwrap(body: dict[str, Any]) -> dict[str, Any]:
    """The request a ``countTokens`` body may wrap whole."""
    inner = body.get("generateContentRequest")
    return inner if isinstance(inner, dict) else body


def parse_request(body: Any) -> RequestInfo:
    info = RequestInfo()
    if not isinstance(body, dict):
        return info
    body = _unwrap(body)
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
    return True if isinstance(response, dict) and "error" in response else None


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


def _wire_args(data: bytes | str) -> list[bytes]:
    """``_raw_args`` of one encoded chunk (none when it does not decode)."""
    try:
        return _raw_args(_raw_decoder.decode(data))
    except msgspec.DecodeError:
        return []


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
        raws = iter(raw_args)
        for part in (cand.get("content") or {}).get("parts") or []:
            if not isinstance(part, dict):
                continue
            fc = part.get("functionCall")
            if isinstance(fc, dict):
                t = r.tool(len(r.tool_calls))
                t["id"], t["name"] = str(fc.get("id") or ""), str(fc.get("name", ""))
                raw = next(raws, b"")
                t["args"].append(raw.decode() if raw else msgspec.json.encode(fc.get("args", {})).decode())
            elif isinstance(part.get("text"), str):
                (r.reasoning if part.get("thought") is True else r.text).append(part["text"])
        if cand.get("finishReason"):
            r.stop_reason = str(cand["finishReason"])
            r.complete = True


def parse_json(body: Any, raw: bytes = b"") -> Reassembled:
    """A whole body: one response, or the JSON-array stream of them (cut off: ``body`` is None)."""
    if body is None and raw.lstrip()[:1] == b"[":
        return parse_array_stream(raw)
    fold = _Fold()
    if isinstance(body, list):
        raws: list[_Chunk] = []
        with contextlib.suppress(msgspec.DecodeError):
            raws = _raw_array_decoder.decode(raw)
        for i, chunk in enumerate(body):
            fold.feed(chunk, _raw_args(raws[i]) if i < len(raws) else [])
    else:
        fold.feed(body, _wire_args(raw))
        fold.r.complete = body is not None
    return fold.r


def parse_array_stream(body: bytes) -> Reassembled:
    """A JSON-array stream cut off: the elements that arrived whole."""
    fold = _Fold()
    for element in array_elements(body):
        fold.feed(loads(element), _wire_args(element))
    fold.r.complete = False
    return fold.r


def parse_stream(body: bytes) -> Reassembled:
    fold = _Fold()
    for _event, data in iter_sse(body):
        fold.feed(loads(data), _wire_args(data))
    return fold.r


def conversation(body: dict[str, Any]) -> Conversation:
    body = _unwrap(body)
    conv = Conversation(tools=_tools(body.get("tools")))
    system = _get(body, "systemInstruction", "system_instruction")
    if isinstance(system, dict):
        conv.messages.append(Message("system", _parts(system.get("parts"))))
    for content in body.get("contents") or []:
        if isinstance(content, dict):
            parts = _parts(content.get("parts"))
            conv.messages.append(Message(_role(content.get("role"), parts), parts))
    return conv


def _tools(tools: Any) -> list[Tool]:
    """The functions the request declares (``parametersJsonSchema``, else the OpenAPI subset)."""
    declared: list[Any] = []
    for tool in tools if isinstance(tools, list) else []:
        found = (
            _get(tool, "functionDeclarations", "function_declarations") if isinstance(tool, dict) else None
        )
        declared += found if isinstance(found, list) else []
    return Tool.listed(
        [
            {**f, "schema": f.get("parametersJsonSchema", f.get("parameters"))}
            for f in declared
            if isinstance(f, dict)
        ],
        "schema",
    )


def _role(role: Any, parts: list[Part]) -> str:
    """``model`` is the assistant; a client's turn of nothing but function responses is the tools'."""
    if role == "model":
        return "assistant"
    if parts and all(p.kind == Kind.TOOL_RESULT for p in parts):
        return "tool"
    return str(role or "user")


def _parts(parts: Any) -> list[Part]:
    return [_part(p) for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


_STANDARD_BASE64 = str.maketrans("-_", "+/")
"""Inline data may come in base64's URL-safe alphabet (google-genai sends it so; the API takes both):
a ``data:`` URL wants the standard one."""


def _part(p: dict[str, Any]) -> Part:
    """One part: text or a thought, a function call or response, inline data or a file by URI."""
    fc = _get(p, "functionCall", "function_call")
    fr = _get(p, "functionResponse", "function_response")
    inline = _get(p, "inlineData", "inline_data")
    linked = _get(p, "fileData", "file_data")
    if isinstance(p.get("text"), str):
        return Part(Kind.REASONING if p.get("thought") is True else Kind.TEXT, p["text"])
    if isinstance(fc, dict):
        return Part.call(fc.get("id"), fc.get("name"), fc.get("args"))
    if isinstance(fr, dict):
        response = fr.get("response")
        return Part.result(_response_text(response), fr.get("id"), fr.get("name"), _is_error(response))
    if isinstance(inline, dict) and isinstance(inline.get("data"), str):
        media, data = str(_get(inline, "mimeType", "mime_type") or ""), inline["data"]
        if media.startswith("image/"):
            return Part.image(None, data.translate(_STANDARD_BASE64), media)
        return Part(Kind.OTHER, f"[{media or 'inline data'}, {len(data)} base64 characters]")
    if isinstance(linked, dict):
        media = str(_get(linked, "mimeType", "mime_type") or "")
        uri = str(_get(linked, "fileUri", "file_uri") or "")
        return (
            Part(Kind.IMAGE, url=uri) if media.startswith("image/") else Part(Kind.OTHER, f"[{media}] {uri}")
        )
    return Part(Kind.OTHER, json.dumps(p))


def wire_usage(u: Usage) -> dict[str, Any]:
    return {
        "promptTokenCount": u.input_total,
        "cachedContentTokenCount": u.cache_read,
        "candidatesTokenCount": u.output - u.reasoning,
        "thoughtsTokenCount": u.reasoning,
        "totalTokenCount": u.input_total + u.output,
    }


def _chunk(reply: Reply, parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: dict[str, Any] = {"candidates": [candidate]}
    if last:
        if reply.stop_reason:
            candidate["finishReason"] = reply.stop_reason
        if reply.usage is not None:
            out["usageMetadata"] = wire_usage(reply.usage)
    return {**out, "modelVersion": reply.model, "responseId": reply.id}


def build_response(reply: Reply) -> dict[str, Any]:
    return _chunk(reply, [_wire_part(p) for p in reply.parts()], True)


def _chunks(reply: Reply) -> list[dict[str, Any]]:
    """The answer as the API streams it: the thoughts, the text, then the function calls with the
    finish reason and the usage."""
    parts = reply.parts()
    said = [_chunk(reply, [_wire_part(p)], False) for p in parts if p.kind != Kind.TOOL_CALL]
    return said + [_chunk(reply, [_wire_part(p) for p in parts if p.kind == Kind.TOOL_CALL], True)]


def build_stream(reply: Reply, path: str = "") -> bytes:
    """The stream as SSE (``?alt=sse``, what the SDKs ask for), or as one JSON array when ``path``
    asks for none."""
    if path and "alt=sse" not in path:
        return b"[" + b",\r\n".join(json.dumps(c).encode() for c in _chunks(reply)) + b"]"
    return sse_body(_chunks(reply), end=b"\r\n\r\n")


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": STATUS.get(status, "INTERNAL")}}


def model_list(models: dict[str, str]) -> dict[str, Any]:
    """``GET /v1beta/models``, one page holding every model."""
    return {"models": [model_entry(m, owner) for m, owner in models.items()]}


def model_entry(model: str, owner: str) -> dict[str, Any]:
    return {"name": f"models/{model}", "displayName": model, "supportedGenerationMethods": list(METHODS)}


def build_request(conv: Conversation, stream: bool = False) -> dict[str, Any]:
    """A request carrying ``conv`` (an importer's synthetic request; the model and whether it
    streams are the path's, not the body's)."""
    body: dict[str, Any] = {}
    if conv.system() is not None:
        body["systemInstruction"] = {"parts": [{"text": conv.system()}]}
    body["contents"] = [
        {"role": "model" if m.role == "assistant" else "user", "parts": [_wire_part(p) for p in m.parts]}
        for m in conv.rest()
    ]
    declared = [
        {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters}
        for t in conv.tools
    ]
    body["tools"] = [{"functionDeclarations": declared}] if declared else []
    return body


def _wire_part(p: Part) -> dict[str, Any]:
    if p.kind == Kind.REASONING:
        return {"text": p.text, "thought": True}
    if p.kind == Kind.IMAGE and p.data_url:
        media, b64 = p.inline()
        return {"inlineData": {"mimeType": media, "data": b64}}
    if p.kind == Kind.IMAGE:
        return {"fileData": {"mimeType": "image/*", "fileUri": p.url}}
    if p.kind == Kind.TOOL_CALL:
        call = {"name": p.name, "args": args_object(p.arguments)[0]}
        return {"functionCall": {**call, "id": p.id} if p.id else call}
    if p.kind == Kind.TOOL_RESULT:
        response: dict[str, Any] = {"name": p.name, "response": {"error" if p.is_error else "output": p.text}}
        return {"functionResponse": {**response, "id": p.id} if p.id else response}
    return {"text": p.text}
