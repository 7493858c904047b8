"""The run spec: one attempt at one cell of a sweep, the same for every executor, written as
``<shard root>/specs/<run id>.json`` and executed by ``amb sweep exec SPEC.json`` (docs/scale-out.md,
The run spec). The run id is a pure function of the cell and the attempt, so every executor, resume
and machine names the same attempt the same way.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import msgspec

from schemas.codec import check_id
from schemas.errors import SchemaError, UsageError
from schemas.events import BudgetLimits
from schemas.task_spec import Tier

SPEC_VERSION = 1
Backend = Literal["docker", "local"]
GpuMode = Literal["nvidia", "env"]


class SpecError(UsageError):
    """A run spec file that cannot be read or executed; the message names the file and the field."""


class Cell(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One cell of a sweep's grid. ``sweep`` namespaces the cell (two sweeps never share run ids)."""

    sweep: str
    agent: str
    task: str
    tier: Tier
    repeat: int

    @property
    def key(self) -> str:
        """The cell's name on disk and in run ids: ``<sweep>-<agent>-<task>-<tier>-r<repeat>``."""
        return f"{slug(self.sweep)}-{slug(self.agent)}-{self.task}-{self.tier}-r{self.repeat}"


class TaskRef(msgspec.Struct, frozen=True):
    """A sweep's task: its id, and the folder of its real data (None: its synthetic twin)."""

    id: str
    data: Path | None = None


class Agent(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What to run: the command (placeholders still in it), the model, upstreams, environment."""

    name: str
    command: list[str]
    model: str = ""
    upstream: list[str] = msgspec.field(default_factory=list)
    """``amb-record --upstream`` values; ``{baseline}`` is the offline baseline, started by the run."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Set in the recorder's environment (real API keys go here: the agent gets placeholders)."""


class CellLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a cell's run may use: time, the container's resources, GPUs and the budget. The
    executor asks its engine for the same; ``amb sweep exec`` passes the allocation's values to
    ``docker run`` (the engine's cgroups do not reach a container, a child of dockerd)."""

    time_limit_s: float
    cpus: float | None = None
    """Docker ``--cpus``; None: the backend's default (2)."""
    memory: str | None = None
    """Docker ``--memory`` (``8g``, ``512m``); None: the backend's default (8g)."""
    gpus: int = 0
    """How many GPUs the run needs; their ids come from the allocation (see ``sweeps.exec``)."""
    budget: BudgetLimits | None = None
    """What the run's model calls may spend, enforced by its recording proxy (``amb-record --max-*``)."""


class RunSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One attempt at one cell, serialised as JSON (``encode`` / ``load``)."""

    cell: Cell
    attempt: int
    agent: Agent
    limits: CellLimits
    backend: Backend
    data: str
    """The task's data root (with ``public/``; ``private/`` never reaches the agent), absolute."""
    shard_root: str
    """The sweep's shared directory, absolute: the shard lands in ``<shard_root>/shards/<run id>``."""
    gpu_mode: GpuMode = "nvidia"
    """``nvidia``: the GPU ids go to ``docker run --gpus device=IDS``; ``env``: into the container's
    ``NVIDIA_VISIBLE_DEVICES`` only (an engine whose default runtime is NVIDIA's, a machine without GPUs)."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Extra run labels (the exec adds sweep, agent, repeat, attempt, model)."""
    v: int = SPEC_VERSION

    @property
    def run_id(self) -> str:
        return run_id(self.cell, self.attempt)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", text)


def run_id(cell: Cell, attempt: int) -> str:
    """``<cell key>`` for the first attempt, ``<cell key>.a<N>`` for the N-th: a pure function."""
    if attempt < 1:
        raise ValueError(f"attempt must be at least 1, got {attempt}")
    return cell.key if attempt == 1 else f"{cell.key}.a{attempt}"


def parse_run_id(value: str) -> tuple[str, int]:
    """The cell key and the attempt number of a run id made by :func:`run_id`."""
    m = re.fullmatch(r"(.+?)(?:\.a(\d+))?", value)
    assert m is not None  # the pattern matches every string
    return m.group(1), int(m.group(2) or 1)


def encode(spec: RunSpec) -> bytes:
    return msgspec.json.format(msgspec.json.encode(spec), indent=2) + b"\n"


def decode(data: bytes, where: str) -> RunSpec:
    """A spec from JSON; every error names ``where`` and the field."""
    try:
        spec = msgspec.json.decode(data, type=RunSpec)
    except msgspec.ValidationError as e:
        raise SpecError(f"{where}: {e}") from None
    except msgspec.DecodeError as e:
        raise SpecError(f"{where}: not valid JSON: {e}") from None
    validate(spec, where)
    return spec


def load(path: Path) -> RunSpec:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror or e}") from None
    return decode(data, str(path))


def validate(spec: RunSpec, where: str) -> None:
    if spec.v > SPEC_VERSION:
        raise SpecError(f"{where}: spec version {spec.v} is newer than this amb reads ({SPEC_VERSION})")
    if spec.attempt < 1 or spec.cell.repeat < 1:
        raise SpecError(f"{where}: attempt and cell.repeat must be at least 1")
    if spec.limits.time_limit_s <= 0:
        raise SpecError(f"{where}: limits.time_limit_s must be positive")
    if spec.limits.gpus < 0 or (spec.limits.cpus is not None and spec.limits.cpus <= 0):
        raise SpecError(f"{where}: limits.gpus must be >= 0 and limits.cpus positive")
    if not spec.agent.command:
        raise SpecError(f"{where}: agent.command is empty")
    for name in ("data", "shard_root"):
        if not Path(getattr(spec, name)).is_absolute():
            raise SpecError(f"{where}: {name} must be an absolute path")
    try:
        check_id("run id", spec.run_id)
    except SchemaError as e:
        raise SpecError(f"{where}: {e}") from None
