"""ATIF (Harbor's Agent Trajectory Interchange Format, v1.x) as msgspec Structs: the one model that
``amb export atif`` writes and ``amb import atif`` reads.

Fields are declared in the order the export writes them, and a field left at its default is not
written (``omit_defaults``), so a document's bytes follow from the Structs alone. Fields a foreign
harness fills with numbers the import turns into facts (token counts, call counts) are ``Any``: the
importer checks each one where it reads it (``recorder.importers.values``), so a refusal names the
step, the field and the value. Fields this model does not name are ignored on import.
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


class Metrics(_Doc):
    prompt_tokens: Any = None
    completion_tokens: Any = None
    cached_tokens: Any = None
    extra: dict[str, Any] | None = None
    """``cache_write_tokens``, ``reasoning_tokens`` and ``reported`` (whether the provider said them)."""


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
    extra: dict[str, Any] | None = None
    """``extra.amb``: the facts an AMB export keeps that ATIF has no field for."""
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


class Trajectory(_Doc):
    schema_version: str | None = None
    """None reads as the newest version, v1.8."""
    session_id: str | None = None
    agent: Agent | None = None
    steps: list[Step] = []
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    extra: dict[str, Any] | None = None
    trajectory_id: str | None = None
    subagent_trajectories: list[Trajectory] = []
