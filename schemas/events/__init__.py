"""The event union: every payload kind, by its dotted tag.

Adding a kind: define it in the module of its family, add it to ``ALL_KINDS``, add it to the
round-trip test and (if it needs a SQL view) to ``replay.views``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from schemas.events.base import Payload, kind_of
from schemas.events.file import FileAccessed, FileDeleted, FileRenamed, FileWritten
from schemas.events.model_call import AssistantMessage, ModelCallCompleted, ToolCallPart, Usage
from schemas.events.network import NetworkRequest
from schemas.events.note import Note
from schemas.events.process import ProcessExited
from schemas.events.run import UNKNOWN_ENDING, BudgetLimits, BudgetSpent, Isolation, RunFinished, RunStarted
from schemas.events.submission import SealedFile, SubmissionSealed
from schemas.events.tool_call import ToolCallRequested, ToolCallResult

ALL_KINDS: tuple[type[Payload], ...] = (
    RunStarted,
    RunFinished,
    ModelCallCompleted,
    ToolCallRequested,
    ToolCallResult,
    ProcessExited,
    FileWritten,
    FileDeleted,
    FileRenamed,
    FileAccessed,
    NetworkRequest,
    SubmissionSealed,
    Note,
)

if TYPE_CHECKING:
    # A type checker sees the common base, so `isinstance` narrows to each kind.
    AnyPayload = Payload
else:
    # noqa UP007: `X | Y` cannot spread a tuple built at import time; Union[...] can.
    AnyPayload = Union[ALL_KINDS]  # noqa: UP007
"""The tagged union of every payload kind (msgspec dispatches on ``kind`` first)."""

KINDS: dict[str, type[Payload]] = {kind_of(k): k for k in ALL_KINDS}
"""Kind tag → payload class."""

__all__ = [
    "ALL_KINDS",
    "AnyPayload",
    "AssistantMessage",
    "BudgetLimits",
    "BudgetSpent",
    "FileAccessed",
    "FileDeleted",
    "FileRenamed",
    "FileWritten",
    "Isolation",
    "KINDS",
    "ModelCallCompleted",
    "NetworkRequest",
    "Note",
    "Payload",
    "ProcessExited",
    "RunFinished",
    "RunStarted",
    "SealedFile",
    "SubmissionSealed",
    "ToolCallPart",
    "ToolCallRequested",
    "ToolCallResult",
    "UNKNOWN_ENDING",
    "Usage",
    "kind_of",
]
