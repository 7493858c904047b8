"""ATIF (Harbor's Agent Trajectory Interchange Format, v1.x) as msgspec Structs: the one model that
``amb export atif`` writes and ``amb import atif`` reads.

Fields are declared in the order the export writes them, and a field left at its default is not
written (``omit_defaults``), so a document's bytes follow from the Structs alone. Fields a foreign
harness fills with numbers the import turns into facts (token counts, call counts) are ``Any``: the
importer checks each one where it reads it (``recorder.importers.values``), so a refusal names the
step, the field and the value. Fields this model does not name are ignored on import.

What an AMB export keeps that ATIF has no field for is under ``extra.amb`` (``StepFacts``,
``RunFacts``) and ``metrics.extra`` (``TokenExtra``), typed here for both directions; a foreign
harness's other ``extra`` keys are free-form, and the import ignores them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import msgspec

from schemas.codec import encode_payload
from schemas.events import Payload

SCHEMA_PREFIX = "ATIF-v1."
"""Every ATIF version this model reads starts so (v1.0 to v1.8)."""
VERSIONS = {"1.8": "ATIF-v1.8", "1.6": "ATIF-v1.6"}
"""The versions ``amb export atif --version`` writes."""

TRAJECTORY = "trajectory.json"
SIDECAR = "events.jsonl"
"""Beside the trajectory: the events ATIF has no slot for, verbatim (their blobs in ``BLOB_DIR``)."""
BLOB_DIR = "blobs"

_BLOB_REF = re.compile(rb'"blob":"(sha256:[0-9a-f]{64})"')


def blob_refs(payload: Payload) -> list[str]:
    """Every stored blob a payload refers to, as ``amb verify`` finds them (a BlobRef, or a note's
    data that names a blob): the blobs a sidecar line needs beside it."""
    return [m.decode() for m in _BLOB_REF.findall(encode_payload(payload))]


def timestamp(ns: int) -> str:
    """A step's ISO 8601 timestamp (UTC, ``Z``) of a time in ns since 1970."""
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat().replace("+00:00", "Z")


class _Doc(msgspec.Struct, omit_defaults=True):
    """A part of an ATIF document: written without the fields left at their default."""


class ContentSource(_Doc):
    path: str | None = None
    """Where an image is, relative to the trajectory's folder (an importer never opens it)."""
    media_type: str | None = None


class ContentPart(_Doc):
    type: str | None = None
    """``text``, or what else the part is (``image``)."""
    text: str | None = None
    source: ContentSource | None = None


Content = str | list[ContentPart] | None
"""A message or an observation's content: text, or content parts."""


class ToolCall(_Doc):
    tool_call_id: str | None = None
    function_name: str | None = None
    arguments: dict[str, Any] | None = None


class ObservationResult(_Doc):
    source_call_id: str | int | None = None
    """The tool call this result answers; none for an observation no call asked for."""
    content: Content = None


class Observation(_Doc):
    results: list[ObservationResult] = []


class TokenExtra(_Doc):
    """``metrics.extra``: the token counts ATIF has no field for. Keys a foreign harness may use
    too, so the counts are ``Any``, checked like ``Metrics``' own."""

    cache_write_tokens: Any = None
    reasoning_tokens: Any = None
    reported: bool | None = None
    """Whether the provider reported the usage (absent: whether the step has metrics)."""


class Metrics(_Doc):
    prompt_tokens: Any = None
    completion_tokens: Any = None
    cached_tokens: Any = None
    extra: TokenExtra | None = None


class CallFacts(_Doc):
    """``step.extra.amb.call``: the model call's envelope, as ``ModelCallCompleted``'s fields of the
    same names. A field left out reads as what a call from a foreign trajectory gets."""

    provider: str = "openai"
    api: str = "chat.completions"
    stream: bool = False
    url: str = ""
    status: int | None = 200
    ok: bool = True
    error: str | None = None
    stop_reason: str | None = None
    started_ns: int | None = None
    """None: the step's timestamp."""
    ttfb_ms: float | None = None
    latency_ms: float | None = None
    retries: int = 0
    partial: bool = False


class Requested(_Doc):
    """When a tool call of the step was asked for (``tool_call.requested``)."""

    ts_ns: int | None = None


class ResultFacts(_Doc):
    """``step.extra.amb.results[k]``: what the k-th observation result's ``tool_call.result`` held
    beside its text."""

    ts_ns: int | None = None
    model_call_id: str | None = None
    name: str | None = None
    is_error: bool | None = None
    inline_chars: int | None = None
    """How much of the text the event held inline (the rest was in a blob); None: all of it."""


class StepFacts(_Doc):
    """``step.extra.amb``: an agent step's model call as AMB recorded it (times in ns since 1970)."""

    call_id: str | None = None
    ts_ns: int | None = None
    """When the call was written (the step's ``timestamp`` is when it started, to the microsecond)."""
    call: CallFacts | None = None
    raw_arguments: dict[str, str] | None = None
    """By tool call id: argument strings that their ``arguments`` object does not spell exactly."""
    requested: dict[str, Requested] | None = None
    """By tool call id: the calls a ``tool_call.requested`` asked for (None: every one)."""
    results: list[ResultFacts] | None = None
    """One per observation result, in order."""
    note: str | None = None
    """Why a step stands in for none (a run without model calls)."""


class StepExtra(_Doc):
    amb: StepFacts | None = None


class Step(_Doc):
    timestamp: str | None = None
    source: str | None = None
    """``system``, ``user`` or ``agent``."""
    message: Content = None
    model_name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    metrics: Metrics | None = None
    llm_call_count: Any = None
    """v1.7 and later: how many model calls the step stands for (0: a deterministic dispatch)."""
    extra: StepExtra | None = None
    step_id: int | None = None
    observation: Observation | None = None
    is_copied_context: bool | None = None


class Agent(_Doc):
    name: str | None = None
    version: str | None = None
    model_name: str | None = None
    tool_definitions: list[Any] | None = None
    """In OpenAI's function shape (``{"type": "function", "function": {...}}``)."""


class FinalMetrics(_Doc):
    total_prompt_tokens: int
    total_completion_tokens: int
    total_cached_tokens: int
    total_steps: int
    extra: dict[str, Any] | None = None


class RunFacts(_Doc):
    """``extra.amb`` of the trajectory: the run it was exported from."""

    run_id: str | None = None
    task: str | None = None
    tier: str | None = None
    backend: str | None = None
    status: str | None = None
    sidecar: str | None = None
    """The sidecar's file name (``SIDECAR``) when the export wrote one."""


class TrajectoryExtra(_Doc):
    amb: RunFacts | None = None


class Trajectory(_Doc):
    schema_version: str | None = None
    """None reads as the newest version, v1.8."""
    session_id: str | None = None
    agent: Agent | None = None
    steps: list[Step] = []
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    extra: TrajectoryExtra | None = None
    trajectory_id: str | None = None
    subagent_trajectories: list[Trajectory] = []
