"""Run boundaries: written by the recorder when a run starts and ends."""

from __future__ import annotations

import msgspec

from schemas.events.base import Payload


class BudgetLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The limits a run was recorded under (``amb-record --max-tokens/--max-cost/--max-calls``)."""

    max_tokens: int | None = None
    """Input (cached included) plus output (reasoning included) tokens of all calls."""
    max_cost_usd: float | None = None
    """Cost of all calls under ``price_table``, as the scorer computes it."""
    max_calls: int | None = None
    """Model calls that reach the upstream (refused ones are not counted)."""
    price_table: str | None = None


class BudgetSpent(msgspec.Struct, frozen=True, kw_only=True):
    """What a budgeted run spent, as the proxy counted it live."""

    calls: int = 0
    """Model calls that reached the upstream."""
    tokens: int = 0
    cost_usd: float | None = None
    """Under ``price_table``; None when a call's model has no price there."""
    price_table: str | None = None
    refused: int = 0
    """Model calls the proxy refused because a limit was reached."""
    limit: str | None = None
    """The limit that stopped the run (``max_calls``, ``max_tokens``, ``max_cost_usd``), if any."""


class Isolation(msgspec.Struct, frozen=True, kw_only=True):
    """What kept the agent's processes apart from the rest of the machine (docs/recording.md, Threat
    model): what an auditor needs to know what the agent could see."""

    kind: str
    """``namespaces`` (local backend: user, PID and mount namespaces of its own and a fresh
    ``/proc``, so it sees only its own processes), ``container`` (docker backend) or ``none``
    (local backend without them: it sees every process of its user)."""
    requested: str | None = None
    """What ``--isolation`` asked for (local backend): ``required``, ``best-effort`` or ``off``."""
    reason: str | None = None
    """Why it is ``none``: ``--isolation off``, or what this system refused (one line)."""


class RunStarted(Payload, frozen=True, tag="run.started"):
    """A recorded run began."""

    VERSION = 2

    task: str | None = None
    """Task id (e.g. ``kidney-seg``), or None for an untasked recording."""
    tier: str | None = None
    """``lite`` or ``standard`` (AutoMedBench's brief tiers), or None."""
    agent: str | None = None
    """A name for the agent (defaults to the command's basename)."""
    model: str | None = None
    """The model the agent was told to use, if known up front."""
    command: list[str] = msgspec.field(default_factory=list)
    """The agent's argv as run, each argument as recorded text (``schemas.ostext``)."""
    backend: str = "local"
    """``local``, ``docker``, or ``synthetic`` for generated runs."""
    workspace: str | None = None
    """The agent's working directory (host path for local, container path for docker), as recorded
    text (``schemas.ostext``)."""
    time_limit_s: float | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Free-form ``K=V`` labels given with ``--label`` (sweep id, repeat index, ...)."""
    tool_versions: dict[str, str] = msgspec.field(default_factory=dict)
    """Versions of amb, mitmproxy, python, the image digest, ..."""
    budget: BudgetLimits | None = None
    """The run's budget, when it had one."""
    isolation: Isolation | None = None
    """How the agent was kept apart from the machine's other processes (None: not known, e.g. an
    imported run)."""


class RunFinished(Payload, frozen=True, tag="run.finished"):
    """A recorded run ended. Always the last event the recorder writes for a run."""

    status: str
    """``completed``, ``failed``, ``timeout``, ``killed``, ``budget_exceeded`` or ``recorder_error``;
    ``unknown`` (``UNKNOWN_ENDING``) for an imported run whose source does not say how it ended."""
    exit_code: int | None = None
    duration_s: float = 0.0
    reason: str | None = None
    """Why the run ended, when it was not a plain exit (signal, time limit, budget, recorder crash)."""
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    """Events written per source and kind, as the recorder saw them (a cross-check for verify)."""
    budget: BudgetSpent | None = None
    """What a budgeted run spent (None: the run had no budget)."""


UNKNOWN_ENDING = "unknown"
"""The status of an imported run whose source keeps no ending (an ATIF trajectory without amb's
sidecar): neither completed nor failed, as far as anyone can tell. The scorer reads no ending into
it, an OpenTelemetry export leaves its span's status unset."""
