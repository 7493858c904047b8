"""A call's conversation shown to a person (the viewer), to a judge (the evidence) and to an
OpenTelemetry consumer: one reading of ``conversation.Conversation`` each, whatever the provider.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from schemas.events import AssistantMessage
from schemas.providers.conversation import Conversation, Kind, Message, Part, Reply

Clip = Callable[[str, int], str]
"""How the viewer cuts a text to a length for the screen."""

IMAGE_NOTE = "[image]"


def for_person(conv: Conversation, cap: int, clip: Clip) -> tuple[list[dict[str, Any]], list[str]]:
    """The viewer's messages (role, text cut at ``cap``, the other parts) and the request's inline
    images as ``data:`` URLs (a part names its image by index: the viewer serves it separately,
    checked, and never puts the request's bytes into the page)."""
    images: list[str] = []
    out = []
    for m in conv.messages:
        text = m.text
        shown: dict[str, Any] = {"role": m.role, "text": text[:cap], "truncated": len(text) > cap}
        parts = [_person_part(p, cap, clip, images) for p in m.parts if p.kind != Kind.TEXT]
        if parts:
            shown["parts"] = parts
        out.append(shown)
    return out, images


def _person_part(p: Part, cap: int, clip: Clip, images: list[str]) -> dict[str, Any]:
    if p.kind == Kind.IMAGE and p.data_url:
        images.append(p.data_url)
        return {"type": "image", "index": len(images) - 1, "chars": len(p.data_url)}
    if p.kind == Kind.IMAGE:
        return {"type": "image", "url": clip(p.url, 300)}
    if p.kind == Kind.TOOL_CALL:
        return {"type": "tool_call", "id": p.id, "name": p.name, "arguments": clip(p.arguments, cap)}
    if p.kind == Kind.TOOL_RESULT:
        return {"type": "tool_result", "id": p.id, "text": p.text[:cap], "truncated": len(p.text) > cap}
    return {"type": str(p.kind), "json": clip(p.text, 300 if p.kind == Kind.OTHER else cap)}


def opening(conv: Conversation) -> list[tuple[str, str]]:
    """What the judge reads of the first request: its system, developer and user messages before
    the model's first turn, as (role, text), an image as ``[image]``."""
    out = []
    for m in conv.messages:
        if m.role == "assistant":
            break
        if m.role in ("system", "developer", "user"):
            out.append((m.role, "\n".join(p.text if p.kind == Kind.TEXT else IMAGE_NOTE for p in _seen(m))))
    return out


def _seen(m: Message) -> list[Part]:
    return [p for p in m.parts if p.kind in (Kind.TEXT, Kind.IMAGE)]


def semconv(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages in the OpenTelemetry GenAI conventions' shape (``gen_ai.input.messages``): a role
    and its parts (``text``, ``reasoning``, ``tool_call``, ``tool_call_response``, ``uri`` or
    ``blob`` for an image: an inline image is named by its size, not copied)."""
    return [{"role": m.role, "parts": [_semconv_part(p) for p in m.parts]} for m in messages]


def _semconv_part(p: Part) -> dict[str, Any]:
    if p.kind in (Kind.TEXT, Kind.REASONING):
        return {"type": str(p.kind), "content": p.text}
    if p.kind == Kind.TOOL_CALL:
        return {"type": "tool_call", "id": p.id, "name": p.name, "arguments": _json_or_text(p.arguments)}
    if p.kind == Kind.TOOL_RESULT:
        return {"type": "tool_call_response", "id": p.id, "response": p.text}
    if p.kind == Kind.IMAGE and p.url:
        return {"type": "uri", "modality": "image", "uri": p.url}
    if p.kind == Kind.IMAGE:
        media = p.data_url[5:].split(";", 1)[0]
        return {
            "type": "blob",
            "modality": "image",
            "mime_type": media,
            "content": f"[{len(p.data_url)} chars]",
        }
    return {"type": "generic", "content": p.text}


def semconv_reply(message: AssistantMessage, stop_reason: str | None) -> list[dict[str, Any]]:
    """A call's answer as ``gen_ai.output.messages``."""
    (out,) = semconv([Message("assistant", Reply(message).parts())])
    out["finish_reason"] = stop_reason or ""
    return [out]


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text
