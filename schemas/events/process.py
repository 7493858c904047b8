"""Processes: observed by the shim (inside the container or around a local run)."""

from __future__ import annotations

import msgspec

from schemas.blob import BlobRef
from schemas.events.base import Payload


class ProcessExited(Payload, frozen=True, tag="process.exited"):
    """A process ran and ended (or was still running when the run ended: ``exit_code`` None)."""

    VERSION = 2

    pid: int
    ppid: int | None = None
    argv: list[str] = msgspec.field(default_factory=list)
    """Each argument as recorded text (``schemas.ostext``)."""
    cwd: str | None = None
    """As recorded text (``schemas.ostext``)."""
    start_ns: int = 0
    end_ns: int = 0
    exit_code: int | None = None
    signal: int | None = None
    tracer: str = "strace"
    """How it was observed: ``strace`` (ptrace), ``proc-poll`` (fallback: short processes may be
    missed), ``recorder`` (the agent process itself) or ``synthetic``."""
    stdout: BlobRef | None = None
    stderr: BlobRef | None = None
