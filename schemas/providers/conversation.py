"""A call's conversation in one shape for every provider: what the viewer, the judge and the exports
read, and what importers and the replay endpoint build bodies from.

Each provider module turns its request body into a ``Conversation`` (``conversation(body)``) and a
``Reply`` into its response body, whole or streamed (``build_response``, ``build_stream``). Roles are
``system``, ``developer``, ``user``, ``assistant`` and ``tool`` (a provider's own names mapped onto
them: Gemini's ``model`` is ``assistant``); parts keep the order the provider gave them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from schemas.events import AssistantMessage, Usage


class Kind(StrEnum):
    TEXT = "text"
    REASONING = "reasoning"
    IMAGE = "image"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    OTHER = "other"
    """Anything else a message holds (audio, a file, a provider's own part), as JSON or a note."""


@dataclass
class Part:
    kind: Kind
    text: str = ""
    """The text (text, reasoning), a tool result's output, or another part's JSON."""
    id: str = ""
    """The tool call's id (tool_call, tool_result), as the body gives it."""
    name: str = ""
    """The tool's name (tool_call; tool_result when the body names it)."""
    arguments: str = ""
    """A tool call's arguments as JSON text."""
    data_url: str = ""
    """An inline image as a ``data:`` URL."""
    url: str = ""
    """An image given by reference (a URL, a file URI)."""
    is_error: bool | None = None
    """A tool result that says it is an error."""

    @classmethod
    def texts(cls, content: Any) -> list[Part]:
        """A plain string as one text part (nothing for an empty one or anything else)."""
        return [cls(Kind.TEXT, content)] if isinstance(content, str) and content else []

    @classmethod
    def call(cls, call_id: Any, name: Any, arguments: Any) -> Part:
        """A tool call, its arguments given as text or as an object."""
        return cls(
            Kind.TOOL_CALL, id=str(call_id or ""), name=str(name or ""), arguments=json_text(arguments)
        )

    @classmethod
    def result(cls, output: str, call_id: Any, name: Any = "", is_error: Any = None) -> Part:
        """A tool result (``is_error`` only when the body says so with a boolean)."""
        error = is_error if isinstance(is_error, bool) else None
        return cls(Kind.TOOL_RESULT, output, id=str(call_id or ""), name=str(name or ""), is_error=error)

    def inline(self) -> tuple[str, str]:
        """An inline image's media type and base64 (empty for an image by reference)."""
        head, _, b64 = self.data_url.partition(",")
        return head.removeprefix("data:").split(";", 1)[0], b64

    @classmethod
    def image(cls, url: Any, b64: Any = None, media_type: Any = None) -> Part:
        """An image given as a URL (a ``data:`` one is inline) or as base64 with its media type."""
        if isinstance(b64, str):
            return cls(Kind.IMAGE, data_url=f"data:{media_type or 'image/png'};base64,{b64}")
        url = str(url or "")
        return cls(Kind.IMAGE, data_url=url) if url.startswith("data:") else cls(Kind.IMAGE, url=url)


@dataclass
class Message:
    role: str
    parts: list[Part] = field(default_factory=list)

    @property
    def text(self) -> str:
        """Its text parts, one per line."""
        return "\n".join(p.text for p in self.parts if p.kind == Kind.TEXT)


@dataclass
class Tool:
    """A tool the request offers the model."""

    name: str
    description: str = ""
    parameters: Any = None
    """Its JSON schema (None: none given)."""

    @classmethod
    def listed(cls, entries: Any, schema: str) -> list[Tool]:
        """Tools given as objects with a ``name``, a ``description`` and their schema under ``schema``."""
        if not isinstance(entries, list):
            return []
        return [
            cls(str(t["name"]), str(t.get("description") or ""), t.get(schema))
            for t in entries
            if isinstance(t, dict) and t.get("name")
        ]


@dataclass
class Conversation:
    messages: list[Message] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)
    model: str | None = None

    def system(self) -> str | None:
        """The system prompt: the first message's text when it is the system's (or developer's)."""
        if self.messages and self.messages[0].role in ("system", "developer"):
            return self.messages[0].text
        return None

    def rest(self) -> list[Message]:
        """The messages after the system prompt."""
        return self.messages[1:] if self.system() is not None else self.messages


@dataclass
class Reply:
    """A model's answer, to be built into a provider's response body."""

    message: AssistantMessage
    model: str | None = None
    stop_reason: str | None = None
    usage: Usage | None = None
    id: str = ""

    def parts(self) -> list[Part]:
        """The answer as a message's parts: its reasoning, its text, its calls."""
        m = self.message
        out = [Part(Kind.REASONING, m.reasoning)] if m.reasoning else []
        out += [Part(Kind.TEXT, m.text)] if m.text else []
        return out + [Part.call(t.id, t.name, t.arguments) for t in m.tool_calls]


def json_text(value: Any) -> str:
    """Arguments (or any value) as the JSON text a tool call carries; a string stays as it is."""
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {}, separators=(",", ":"), ensure_ascii=False)


def args_object(text: str) -> tuple[dict[str, Any], str]:
    """A tool call's argument text for a provider that wants an object: the object, and its text
    (the text as it was when it is one; ``{}`` for text that is no JSON object, since the wire
    format has no place for anything else)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    return (value, text) if isinstance(value, dict) else ({}, "{}")
