"""Run boundaries: written by the recorder when a run starts and ends."""

from __future__ import annotations

import msgspec

from schemas.events.base import Payload


class RunStarted(Payload, frozen=True, tag="run.started"):
    """A recorded run began."""

    task: str | None = None
    """Task id (e.g. ``kidney-seg``), or None for an untasked recording."""
    tier: str | None = None
    """``lite`` or ``standard`` (AutoMedBench's brief tiers), or None."""
    agent: str | None = None
    """A name for the agent (defaults to the command's basename)."""
    model: str | None = None
    """The model the agent was told to use, if known up front."""
    command: list[str] = msgspec.field(default_factory=list)
    """The agent's argv as run."""
    backend: str = "local"
    """``local``, ``docker``, or ``synthetic`` for generated runs."""
    workspace: str | None = None
    """The agent's working directory (host path for local, container path for docker)."""
    time_limit_s: float | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Free-form ``K=V`` labels given with ``--label`` (sweep id, repeat index, ...)."""
    tool_versions: dict[str, str] = msgspec.field(default_factory=dict)
    """Versions of amb, mitmproxy, python, the image digest, ..."""


class RunFinished(Payload, frozen=True, tag="run.finished"):
    """A recorded run ended. Always the last event the recorder writes for a run."""

    status: str
    """``completed``, ``failed``, ``timeout``, ``killed`` or ``recorder_error``."""
    exit_code: int | None = None
    duration_s: float = 0.0
    reason: str | None = None
    """Why the run ended, when it was not a plain exit (signal, time limit, recorder crash)."""
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    """Events written per source and kind, as the recorder saw them (a cross-check for verify)."""
