"""What a provider parser recovers from one call's request and response."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.events import AssistantMessage, ToolCallPart, Usage


@dataclass
class ToolResult:
    """A tool result the agent sent back to the model inside a request."""

    tool_call_id: str
    output: str
    name: str | None = None
    is_error: bool | None = None


@dataclass
class RequestInfo:
    model: str | None = None
    stream: bool = False
    tool_results: list[ToolResult] = field(default_factory=list)
    chars: int = 0
    """Characters of prompt-ish content, for the usage estimate when none is reported."""
    conversation: str | None = None
    """Gemini: a digest of the conversation's first content (for tool call ids: ``gemini``)."""
    turns: int = 0
    """Gemini: how many contents the request sent."""


@dataclass
class Reassembled:
    """The response, rebuilt from a JSON body or from a stream's events."""

    model: str | None = None
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[Any, dict[str, Any]] = field(default_factory=dict)
    """Keyed by the provider's index; values hold ``id``, ``name`` and ``args`` (a list of pieces)."""
    stop_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    """An error the provider reported in the body (or as a stream event)."""
    complete: bool = False
    """The terminal event (or a whole JSON body) was seen."""
    cost: float | None = None
    """The cost the provider or gateway reported (OpenRouter's ``usage.cost``), if any."""

    def tool(self, key: Any) -> dict[str, Any]:
        return self.tool_calls.setdefault(key, {"id": "", "name": "", "args": []})

    def message(self) -> AssistantMessage:
        return AssistantMessage(
            text="".join(self.text),
            reasoning="".join(self.reasoning),
            tool_calls=[
                ToolCallPart(id=t["id"], name=t["name"], arguments="".join(t["args"]))
                for t in self.tool_calls.values()
            ],
        )


def loads(data: bytes | str) -> Any:
    """JSON to Python objects; None when it is not JSON (never raises). A body the agent nested
    deeper than the decoder's recursion can go is not JSON either: kept as the bytes it is."""
    try:
        return msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def text_of(content: Any) -> str:
    """Plain text of a message content that is a string or a list of parts/blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                t = part.get("text")
                if isinstance(t, str):
                    out.append(t)
        return "".join(out)
    if content is None:
        return ""
    return msgspec.json.encode(content).decode()


def error_text(body: Any) -> str | None:
    """The provider's error message in an error body (both vendors use ``{"error": {...}}``)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            msg = err.get("message") or err.get("type")
            return str(msg) if msg else "error"
        if isinstance(err, str):
            return err
    return None


CACHE_READ_SPELLINGS = ("prompt_cache_hit_tokens", "cached_tokens", "cache_read_input_tokens")
"""Where OpenAI-compatible providers put cached input outside ``*_tokens_details.cached_tokens``:
DeepSeek, Moonshot, and gateways that pass Anthropic's name through. All inside the prompt total."""


def _first_int(*sources: tuple[Any, str]) -> int:
    for obj, key in sources:
        if isinstance(obj, dict) and key in obj:
            return as_int(obj[key])
    return 0


def openai_usage(u: Any, prefix: tuple[str, str], input_name: str, output_name: str) -> Usage | None:
    """OpenAI usage in the containment convention (cached inside input, reasoning inside output).

    Chat Completions says ``prompt``/``completion`` where Responses says ``input``/``output``:
    ``prefix`` picks the ``*_tokens_details`` objects, the names pick the totals. Cached tokens are
    read under every spelling OpenAI-compatible providers use (``CACHE_READ_SPELLINGS``); cache
    writes where OpenRouter reports them (``prompt_tokens_details.cache_write_tokens``)."""
    if not isinstance(u, dict):
        return None
    idt = u.get(f"{prefix[0]}_tokens_details")
    odt = u.get(f"{prefix[1]}_tokens_details")
    return Usage(
        input_total=as_int(u.get(input_name)),
        cache_read=_first_int((idt, "cached_tokens"), *((u, k) for k in CACHE_READ_SPELLINGS)),
        cache_write=_first_int((idt, "cache_write_tokens"), (u, "cache_creation_input_tokens")),
        output=as_int(u.get(output_name)),
        reasoning=_first_int((odt, "reasoning_tokens"), (u, "reasoning_tokens")),
    )


def reported_cost(u: Any) -> float | None:
    """The call's cost as a gateway reports it in the usage object (OpenRouter: ``cost``, USD)."""
    if isinstance(u, dict):
        cost = u.get("cost")
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            return float(cost)
    return None
