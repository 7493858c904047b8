"""What a provider parser recovers from one call's request and response, and the helpers the
parsers share (lenient JSON, text of a content, error bodies, OpenAI-style usage)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.events import AssistantMessage, ToolCallPart, Usage

QUOTA, INVALID, NOT_FOUND, REPLAY_MISS = "quota", "invalid_request", "not_found", "replay_miss"
"""The errors amb itself answers a model call with (a budget refusal, a request the replay endpoint
cannot read, a path it does not serve, a request no recorded call matches), each provider module
naming them in its own error body (``error_body(status, message, kind)``)."""


@dataclass
class ToolResult:
    """A tool result the agent sent back to the model inside a request."""

    tool_call_id: str
    """The recorded id of the call it answers (set by the proxy's tool-call ledger; empty until then)."""
    output: str
    name: str | None = None
    is_error: bool | None = None
    wire: str = ""
    """The id the request gives the call it answers (the provider's, or one the client made up)."""
    position: int = -1
    """Where the result is in the request's conversation (item index)."""
    turn: int = -1
    """Where the model turn holding the call it answers is (item index; -1: none in the request)."""
    index: int = 0
    """Which of that turn's calls it answers (as the request shows the turn)."""


@dataclass
class ModelTurn:
    """A model turn of a request's conversation that asked for tools, as the request shows it.
    The ledger looks at one or two of a request's turns: what it compares is worked out then."""

    calls: list[tuple[str, str, Any]]
    """(id, name, arguments) of each call."""

    @property
    def ids(self) -> frozenset[str]:
        """The ids it gives its calls (the provider's, or the client's own), empty ones left out."""
        return frozenset(w for w, _, _ in self.calls if w)


@dataclass
class RequestInfo:
    model: str | None = None
    stream: bool = False
    tool_results: list[ToolResult] = field(default_factory=list)
    chars: int = 0
    """Characters of prompt-ish content, for the usage estimate when none is reported."""
    chain: list[int] = field(default_factory=list)
    """The conversation the request carries, chained item by item (by the proxy's history digests);
    empty when it carries none (``countTokens``, a body that is not the API's)."""
    items: list[Any] | None = None
    """The conversation's items as the parser found them, until the proxy chains them (it knows
    whether the body was skimmed) and lets them go."""
    model_turns: dict[int, ModelTurn] = field(default_factory=dict)
    """The model turns in that conversation that asked for tools: item index → their calls."""
    previous: str | None = None
    """The response the request continues, when the API keeps the history (Responses'
    ``previous_response_id``)."""

    @classmethod
    def of(cls, body: Any) -> RequestInfo:
        """The facts every request body gives the same way: its ``model`` and ``stream`` flag."""
        info = cls()
        if isinstance(body, dict):
            info.model = body.get("model") if isinstance(body.get("model"), str) else None
            info.stream = body.get("stream") is True
        return info


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
    response_id: str | None = None
    """The provider's id of the response, when a later request can name it (Responses)."""

    @classmethod
    def whole(cls, body: Any, usage: Callable[[Any], Usage | None]) -> Reassembled:
        """What every whole JSON body says the same way: its error, model and ``usage`` object."""
        r = cls(complete=True)
        if isinstance(body, dict):
            r.error, r.model, r.usage = error_text(body), body.get("model"), usage(body.get("usage"))
        return r

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
        texts = [part.get("text") if isinstance(part, dict) else part for part in content]
        return "".join(t for t in texts if isinstance(t, str))
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


class Pairing:
    """Reads the model turns of a request's conversation, and finds the call each tool result
    answers among them: the call with the id the result names (the nearest earlier turn holding
    it), else the call in the same position among the results after the last model turn if its
    name agrees, else the first call of that name in that turn. A result that names no function
    takes its call's name. A model turn is a run of consecutive items the model produced (a client
    may store one answer as several), placed where the run starts."""

    @classmethod
    def of(cls, info: RequestInfo, items: Any) -> Pairing | None:
        """The pairing of a request whose conversation is ``items`` (kept in ``info.items`` for the
        proxy to chain); None when ``items`` is no list (no conversation)."""
        if not isinstance(items, list):
            return None
        info.items = items
        return cls(info)

    def __init__(self, info: RequestInfo):
        self.info = info
        self.turn = -1
        self.calls: list[tuple[str, str, Any]] = []
        """(id, name, arguments) of the last model turn's calls."""
        self.by_wire: dict[str, tuple[int, int, str]] = {}
        """id → (turn, index, name) of every call with an id, the latest turn's last."""
        self.since = 0
        """Results seen since the last model turn."""
        self._start = -1
        self._asked: list[tuple[str, str, Any]] = []

    def model(self, position: int, calls: list[tuple[str, str, Any]]) -> None:
        """An item the model produced at ``position``, asking for ``calls`` as (id, name, arguments)."""
        if self._start < 0:
            self._start, self._asked = position, []
        self._asked += calls

    def client(self) -> None:
        """An item of the client's: the model turn being read, if any, is over."""
        start, asked, self._start = self._start, self._asked, -1
        if start < 0 or not asked:
            return
        self.info.model_turns[start] = ModelTurn(asked)
        self.turn, self.calls, self.since = start, asked, 0
        for i, (wire, name, _) in enumerate(asked):
            if wire:
                self.by_wire[wire] = (start, i, name)

    def result(self, position: int, wire: str, name: str, output: str, is_error: bool | None) -> None:
        """A tool result (an item of the client's, or part of one) at ``position``."""
        self.client()
        k, self.since = self.since, self.since + 1
        if wire and wire in self.by_wire:
            turn, index, called = self.by_wire[wire]
        else:
            turn, index = self.turn, k
            if not (k < len(self.calls) and (not name or self.calls[k][1] == name)):
                index = next((i for i, c in enumerate(self.calls) if c[1] == name), k)
            called = self.calls[index][1] if index < len(self.calls) else ""
        self.info.tool_results.append(
            ToolResult("", output, (name or called) or None, is_error, wire, position, turn, index)
        )
