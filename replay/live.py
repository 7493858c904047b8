"""The live view of runs as they record (``amb watch``): their spools followed as they grow.

A ``SpoolTail`` reads only what was appended since its last poll, keeps the complete frames (checked
as ``amb ingest`` checks them) and leaves a partial last frame for the next poll. It opens the file
read-only and takes no lock: the recorder never waits for a watcher.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from replay.read import iter_events
from replay.spools import open_spool, read_bytes
from replay.store import DB_NAME, Store
from replay.summary import RunSummary
from schemas.codec import Event, decode_event
from schemas.display import clip
from schemas.errors import AmbError, SchemaError, SpoolError
from schemas.events import (
    FileDeleted,
    FileRenamed,
    FileWritten,
    ModelCallCompleted,
    ProcessExited,
    RunFinished,
    RunStarted,
    SubmissionSealed,
    ToolCallRequested,
    ToolCallResult,
)
from schemas.frames import COMPRESSED_SUFFIX, DROPPED_SUFFIX, MAGIC, complete_end, frames
from schemas.prices import PriceTable, call_cost

SHOWN = 100
"""Characters of a text (tool arguments, model output) shown on a one-line summary."""


class SpoolTail:
    """Follows one spool file from its start: each ``poll`` returns the events appended since.

    Once its run is ingested the spool may be replaced by its zstd copy (``<source>.spool.zst``,
    ``replay.spools``), the same bytes: the tail goes on reading there, from where it was."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        """Where the next complete frame starts (just after the last one read)."""
        self.torn = 0
        """Bytes after the last complete frame at the last poll (a frame still being written)."""
        self.final = False
        """Read from the compressed copy, which no longer grows: nothing more will come."""
        self.frames = 0
        """Complete frames read so far."""

    def _read(self, max_bytes: int) -> bytes:
        if self.final:
            return b""
        try:
            with open_spool(self.path) as f:
                f.seek(self.offset)
                return f.read(max_bytes)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise SpoolError(f"cannot read {self.path}: {e}") from e
        packed = self.path.with_name(self.path.name + COMPRESSED_SUFFIX)
        try:
            data = read_bytes(packed)
        except FileNotFoundError:
            return b""
        except (OSError, zstandard.ZstdError) as e:
            raise SpoolError(f"cannot read {packed}: {e}") from e
        self.final = True
        return data[self.offset :]

    def poll(self, max_bytes: int = 64 << 20) -> list[Event]:
        data = self._read(max_bytes)
        start = 0
        if self.offset == 0:
            if len(data) < len(MAGIC):
                self.torn = len(data)
                return []  # the header itself is not complete yet
            if not data.startswith(MAGIC):
                raise SpoolError(f"{self.path}: not a spool file (bad magic)")
            start = len(MAGIC)
        end = max(complete_end(data), start)
        bodies = frames(data, start, end, str(self.path), number=self.frames, at=self.offset)
        first = self.frames
        self.frames += len(bodies)
        self.offset += end
        self.torn = len(data) - end
        return [self._decoded(body, first + i) for i, body in enumerate(bodies)]

    def _decoded(self, body: bytes, frame: int) -> Event:
        try:
            return decode_event(body)
        except SchemaError as e:
            raise type(e)(f"{self.path}: frame {frame}: {e}") from e


def _cut(text: str, n: int = SHOWN) -> str:
    return clip(" ".join(text.split()), n)


@dataclass
class LiveRun:
    """What is known of one run so far, from the events seen: its summary (``replay.summary``, the
    figures ``amb show`` gives once it is stored) and what a person watching it wants besides."""

    run_id: str
    prices: PriceTable | None = None
    """Each call is priced as ``amb score`` prices it (``schemas.prices.call_cost``); the run's total
    is rounded once, as ``amb score`` rounds it. None: the cost is unknown."""
    summary: RunSummary = field(init=False)
    time_limit_s: float | None = None
    finished_ns: int | None = None
    reason: str | None = None
    cost_reason: str | None = None
    last_model_call: dict[str, Any] | None = None
    tool_results: int = 0
    last_tool_call: dict[str, Any] | None = None
    last_process: dict[str, Any] | None = None
    files_deleted: int = 0
    files_renamed: int = 0
    last_file: dict[str, Any] | None = None
    submitted_files: int | None = None
    error: str | None = None
    """Why this run's spools could not be followed further (corruption, an unknown event kind)."""
    _tools: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _cost: float | None = field(default=None, repr=False)
    """The unrounded sum (the summary's cost is it rounded to 6 places, as ``amb score`` rounds)."""

    def __post_init__(self) -> None:
        self.summary = RunSummary(run_id=self.run_id)
        if self.prices is not None:
            self._cost = self.summary.cost_usd = 0.0  # priced from the first call: nothing spent yet

    def apply(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.summary.add(ev)
            p = ev.payload
            where = f"{ev.source}:{ev.seq}"
            if isinstance(p, RunStarted):
                self.time_limit_s = p.time_limit_s
            elif isinstance(p, RunFinished):
                self.reason, self.finished_ns = p.reason, ev.ts_ns
            elif isinstance(p, ModelCallCompleted):
                self._model_call(p, where, ev.ts_ns)
            elif isinstance(p, ToolCallRequested):
                call = {
                    "event": where,
                    "ts_ns": ev.ts_ns,
                    "name": p.name,
                    "arguments": _cut(p.arguments),
                    "result": None,
                }
                self._tools[p.tool_call_id] = call
                self.last_tool_call = call
            elif isinstance(p, ToolCallResult):
                self.tool_results += 1
                answered = self._tools.pop(p.tool_call_id, None)
                result = {"event": where, "is_error": p.is_error, "output": _cut(p.output)}
                if answered is not None:
                    answered["result"] = result
                else:
                    self.last_tool_call = {"event": where, "name": p.name, "arguments": "", "result": result}
            elif isinstance(p, ProcessExited):
                self.last_process = {"event": where, "cmd": _cut(" ".join(p.argv)), "exit_code": p.exit_code}
            elif isinstance(p, FileWritten):
                self.last_file = {"event": where, "op": p.op, "path": p.path, "size": p.size}
            elif isinstance(p, FileDeleted):
                self.files_deleted += 1
                self.last_file = {"event": where, "op": "deleted", "path": p.path}
            elif isinstance(p, FileRenamed):
                self.files_renamed += 1
                self.last_file = {"event": where, "op": "renamed", "path": p.dst, "from": p.src}
            elif isinstance(p, SubmissionSealed):
                self.submitted_files = len(p.files)

    def _model_call(self, p: ModelCallCompleted, where: str, ts_ns: int) -> None:
        if self.prices is not None:
            priced = call_cost(p, self.prices, self.summary.model)
            if priced is None:
                self._cost = None
                model = p.model or self.summary.model or "(unknown model)"
                self.cost_reason = f"not in price table {self.prices.table.name}: {model}"
            elif self._cost is not None:
                self._cost += priced[0]
            self.summary.cost_usd = None if self._cost is None else round(self._cost, 6)
        self.last_model_call = {
            "event": where,
            "ts_ns": ts_ns,
            "model": p.model,
            "ok": p.ok,
            "error": p.error,
            "stop_reason": p.stop_reason,
            "input_tokens": p.usage.input_total,
            "output_tokens": p.usage.output,
            "latency_ms": p.latency_ms,
            "tool_calls": [t.name for t in p.message.tool_calls],
            "text": _cut(p.message.text),
        }

    @property
    def status(self) -> str:
        """``run.finished``'s status; before it ``running``, or ``waiting`` (no event yet)."""
        s = self.summary
        if self.finished_ns is not None:
            return s.status
        return "running" if s.started_ns is not None else "waiting"

    def view(self, now_ns: int | None = None) -> dict[str, Any]:
        """The run as one JSON object (what ``amb watch --json`` prints)."""
        s = self.summary
        now = time.time_ns() if now_ns is None else now_ns
        elapsed = remaining = None
        if s.started_ns is not None:
            elapsed = round(((self.finished_ns or now) - s.started_ns) / 1e9, 1)
            if self.time_limit_s is not None and self.finished_ns is None:
                remaining = round(max(self.time_limit_s - elapsed, 0.0), 1)
        return {
            "run_id": self.run_id,
            "status": self.status,
            "reason": self.reason,
            "task": s.task,
            "agent": s.agent,
            "model": s.model,
            "step": s.model_calls,
            "model_calls": s.model_calls,
            "failed_calls": s.failed_calls,
            "tokens": s.tokens.shown(),
            "cost_usd": s.cost_usd,
            "cost_reason": self.cost_reason,
            "last_model_call": self.last_model_call,
            "tool_calls": s.tool_calls,
            "tool_results": self.tool_results,
            "last_tool_call": self.last_tool_call,
            "processes_exited": s.processes,
            "last_process": self.last_process,
            "files_written": s.file_writes,
            "files_deleted": self.files_deleted,
            "files_renamed": self.files_renamed,
            "last_file": self.last_file,
            "submitted_files": self.submitted_files,
            "elapsed_s": elapsed,
            "remaining_s": remaining,
            "events": s.events,
            "last_event_ns": s.last_ns,
            "error": self.error,
        }


class RunFollower:
    """Follows every spool of one run directory (a source's spool may appear at any time), as written
    or compressed after ingest. A spool dropped after ingest is read once from the store that holds
    the run, and so is every source of a ``stored`` run with no spool directory (one that came into
    the store from elsewhere: ``amb ingest --from``, an import)."""

    def __init__(self, run_dir: Path, prices: PriceTable | None = None, stored: bool = False):
        self.dir = run_dir
        self.state = LiveRun(run_dir.name, prices=prices)
        self.tails: dict[str, SpoolTail] = {}
        self.stored = stored
        self.from_store: set[str] = set()
        """Dropped spools whose events were read from the store."""

    def _sources(self) -> tuple[list[str], list[str] | None]:
        """The spool names (``<source>.spool``) to tail, and those dropped after ingest."""
        tailed, dropped = set(), set()
        for n in os.listdir(self.dir):
            if n.endswith(".spool") or n.endswith(".spool" + COMPRESSED_SUFFIX):
                tailed.add(n.removesuffix(COMPRESSED_SUFFIX))
            elif n.endswith(".spool" + DROPPED_SUFFIX):
                dropped.add(n.removesuffix(DROPPED_SUFFIX))
        return sorted(tailed), sorted(dropped - tailed - self.from_store)

    def _stored(self, names: list[str] | None) -> list[Event]:
        """The events of these spools (None: of every source) from the store."""
        root = self.dir.parent.parent
        if not (root / DB_NAME).exists():
            what = f"{self.dir / names[0]} was dropped after ingest" if names else f"no spools at {self.dir}"
            raise SpoolError(f"{what} and there is no store at {root}")
        sources = None if names is None else {n.removesuffix(".spool") for n in names}
        with Store.open(root, read_only=True) as st:
            events = [
                e for e in iter_events(st.con, self.state.run_id) if sources is None or e.source in sources
            ]
        self.from_store.update(names or ["*"])
        return events

    def poll(self) -> bool:
        """Read what was appended; True if anything new was seen."""
        if self.state.error is not None:
            return False
        try:
            names, dropped = self._sources()
        except FileNotFoundError:
            if not self.stored or self.from_store:
                return False
            names, dropped = [], None  # every source, from the store
        except OSError as e:
            self.state.error = f"cannot list {self.dir}: {e}"
            return True
        new: list[Event] = []
        try:
            for name in names:
                tail = self.tails.get(name)
                if tail is None:
                    tail = self.tails[name] = SpoolTail(self.dir / name)
                new += tail.poll()
            if dropped is None or dropped:
                new += self._stored(dropped)
        except AmbError as e:
            self.state.error = str(e)
            return True
        # Across sources, in time order (each source's own order is its seq, kept by the sort's
        # stability within a poll).
        new.sort(key=lambda e: e.ts_ns)
        self.state.apply(new)
        return bool(new)

    @property
    def finished(self) -> bool:
        return self.state.finished_ns is not None
