"""Tool calls, recovered from model traffic: requested in a response, answered in a later request."""

from __future__ import annotations

from schemas.blob import BlobRef
from schemas.events.base import Payload


class ToolCallRequested(Payload, frozen=True, tag="tool_call.requested"):
    """The model asked for a tool call."""

    tool_call_id: str
    name: str
    arguments: str
    """The raw argument string."""
    model_call_id: str
    """The ``call_id`` of the model call whose response asked for it."""


class ToolCallResult(Payload, frozen=True, tag="tool_call.result"):
    """The agent sent a tool call's result back to the model (first time it was seen)."""

    tool_call_id: str
    model_call_id: str
    """The ``call_id`` of the model call whose request carried the result."""
    name: str | None = None
    output: str = ""
    """The result text as sent to the model, up to a size cap (see ``output_blob``)."""
    output_blob: BlobRef | None = None
    """The full result when it was longer than the cap."""
    is_error: bool | None = None
