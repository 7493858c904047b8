"""Model calls, recovered from the traffic by the proxy."""

from __future__ import annotations

import msgspec

from schemas.blob import BlobRef
from schemas.events.base import Payload


class ToolCallPart(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call the model asked for, as it appeared in the response."""

    id: str
    name: str
    arguments: str
    """The raw argument string, byte for byte (it may not even be valid JSON)."""


class AssistantMessage(msgspec.Struct, frozen=True, kw_only=True):
    """The reassembled assistant output (streams are reassembled from their deltas)."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallPart] = msgspec.field(default_factory=list)


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token usage: ``input_total`` INCLUDES ``cache_read`` and ``cache_write``; ``output`` INCLUDES
    ``reasoning`` (each provider's convention is normalised to this one)."""

    input_total: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    reasoning: int = 0
    reported: bool = True
    """False when the provider sent no usage and the numbers are estimates."""


class ModelCallCompleted(Payload, frozen=True, tag="model_call.completed"):
    """One model API call, successful or not. Failures are recorded, never dropped."""

    call_id: str
    provider: str
    """``openai``, ``anthropic`` or ``gemini`` (the wire format; Azure and OpenAI-compatible gateways
    speak ``openai``: see ``upstream``)."""
    api: str
    """``chat.completions``, ``responses``, ``messages``, ``generateContent``,
    ``streamGenerateContent`` or ``countTokens``."""
    model: str | None = None
    stream: bool = False
    url: str = ""
    """The URL called upstream: scheme, host, path and query (a ``key`` parameter masked)."""
    status: int | None = None
    """HTTP status from upstream, None when no response arrived."""
    ok: bool = True
    error: str | None = None
    """Why the call failed: ``http_500``, ``upstream_reset``, ``client_disconnected``, ..."""
    request: BlobRef | None = None
    response: BlobRef | None = None
    message: AssistantMessage = msgspec.field(default_factory=AssistantMessage)
    stop_reason: str | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    started_ns: int = 0
    ttfb_ms: float | None = None
    latency_ms: float | None = None
    retries: int = 0
    partial: bool = False
    """True when the response was cut off (stream reset, recorder shutdown mid-flight)."""
    requested_model: str | None = None
    """The model the request named: its body's ``model``, Gemini's ``models/MODEL`` path, or the
    Azure deployment's name. (``model`` is the served one when the response names it, else this.)"""
    served_model: str | None = None
    """The model the response says served the call (``model``, Gemini's ``modelVersion``): a gateway
    may serve another model, or a dated version, than the one asked for."""
    upstream: str | None = None
    """The ``--upstream`` the call went to (``openai``, ``gemini``, ``azure``, or a named one such as
    ``openrouter``); None for a call that went through the regular proxy."""
    cost_usd: float | None = None
    """The cost the provider or gateway reported for this call (OpenRouter's ``usage.cost``), in
    USD; None when it reported none (the scorer then prices the tokens with a price table)."""
