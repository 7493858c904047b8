"""The live view of runs as they record: their spools followed as they grow.

A ``SpoolTail`` remembers where it stopped in one spool file and, on each ``poll``, reads only the
bytes appended since, keeps the complete frames (each length and checksum checked, as ``amb
ingest`` would) and leaves a partially written last frame for the next poll. It opens the file
read-only and takes no lock, so the recorder never waits for a watcher: a watcher costs it
nothing but the page cache it already shares. After ingest a spool is read from its compressed
copy; only a spool dropped after ingest sends the watcher to the store (read-only, once).

``LiveRun`` folds one run's events (from all of its sources) into what a person watching wants:
its step, the last model call and tool call, tokens, files, processes, times and status. Pricing
is the caller's (``price``): the scorer's price tables live above this layer.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from replay.read import iter_events
from replay.spools import read_bytes
from replay.store import DB_NAME, Store
from schemas.codec import Event, decode_event
from schemas.errors import AmbError, SpoolError
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
from schemas.frames import COMPRESSED_SUFFIX, DROPPED_SUFFIX, MAGIC

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

    def _read(self, max_bytes: int) -> bytes:
        if self.final:
            return b""
        try:
            with open(self.path, "rb") as f:
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
        end = data.rfind(b"\n") + 1
        if end <= start:
            self.offset += start
            self.torn = len(data) - start
            return []
        events: list[Event] = []
        pos = start
        sha256 = hashlib.sha256
        for line in data[start : end - 1].split(b"\n"):
            parts = line.split(b"\t", 2)
            if len(parts) != 3 or not parts[0].isdigit() or int(parts[0]) != len(parts[2]):
                raise SpoolError(f"{self.path}: corrupt frame at byte {self.offset + pos}")
            digest = sha256(parts[2]).hexdigest()
            if digest.encode() != parts[1]:
                raise SpoolError(f"{self.path}: checksum mismatch in the frame at byte {self.offset + pos}")
            events.append(decode_event(parts[2], "sha256:" + digest))
            pos += len(line) + 1
        self.offset += end
        self.torn = len(data) - end
        return events


def _cut(text: str, n: int = SHOWN) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


Pricer = Callable[[ModelCallCompleted, str | None], tuple[float | None, str | None]]
"""(a call, the run's model) -> (its cost in USD, unrounded, or None with the reason it could not
be priced). The run's total is rounded once, as ``amb score`` rounds it."""


@dataclass
class LiveRun:
    """What is known of one run so far, from the events seen."""

    run_id: str
    price: Pricer | None = None
    task: str | None = None
    agent: str | None = None
    model: str | None = None
    backend: str | None = None
    started_ns: int | None = None
    finished_ns: int | None = None
    time_limit_s: float | None = None
    status: str = "waiting"
    """``waiting`` (no event yet), ``running``, or the status of ``run.finished``."""
    reason: str | None = None
    model_calls: int = 0
    failed_calls: int = 0
    tokens: dict[str, int] = field(
        default_factory=lambda: {"input": 0, "cache_read": 0, "output": 0, "reasoning": 0}
    )
    cost_usd: float | None = 0.0
    cost_reason: str | None = None
    last_model_call: dict[str, Any] | None = None
    tool_calls: int = 0
    tool_results: int = 0
    last_tool_call: dict[str, Any] | None = None
    processes_exited: int = 0
    last_process: dict[str, Any] | None = None
    files_written: int = 0
    files_deleted: int = 0
    files_renamed: int = 0
    last_file: dict[str, Any] | None = None
    submitted_files: int | None = None
    events: int = 0
    last_event_ns: int | None = None
    error: str | None = None
    """Why this run's spools could not be followed further (corruption, an unknown event kind)."""
    _tools: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _cost: float | None = field(default=0.0, repr=False)
    """The unrounded sum (``cost_usd`` is it rounded to 6 places, as ``amb score`` rounds)."""

    def apply(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.events += 1
            self.last_event_ns = max(self.last_event_ns or 0, ev.ts_ns)
            p = ev.payload
            where = f"{ev.source}:{ev.seq}"
            if isinstance(p, RunStarted):
                self.task, self.agent, self.model, self.backend = p.task, p.agent, p.model, p.backend
                self.started_ns, self.time_limit_s = ev.ts_ns, p.time_limit_s
                if self.status == "waiting":
                    self.status = "running"
            elif isinstance(p, RunFinished):
                self.status, self.reason, self.finished_ns = p.status, p.reason, ev.ts_ns
            elif isinstance(p, ModelCallCompleted):
                self._model_call(p, where, ev.ts_ns)
            elif isinstance(p, ToolCallRequested):
                self.tool_calls += 1
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
                self.processes_exited += 1
                self.last_process = {"event": where, "cmd": _cut(" ".join(p.argv)), "exit_code": p.exit_code}
            elif isinstance(p, FileWritten):
                self.files_written += 1
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
        self.model_calls += 1
        self.failed_calls += not p.ok
        u = p.usage
        self.tokens["input"] += u.input_total
        self.tokens["cache_read"] += u.cache_read
        self.tokens["output"] += u.output
        self.tokens["reasoning"] += u.reasoning
        if self.price is not None:
            cost, why = self.price(p, self.model)
            if cost is None:
                self._cost, self.cost_reason = None, why
            elif self._cost is not None:
                self._cost += cost
            self.cost_usd = None if self._cost is None else round(self._cost, 6)
        tools = [t.name for t in p.message.tool_calls]
        self.last_model_call = {
            "event": where,
            "ts_ns": ts_ns,
            "model": p.model,
            "ok": p.ok,
            "error": p.error,
            "stop_reason": p.stop_reason,
            "input_tokens": u.input_total,
            "output_tokens": u.output,
            "latency_ms": p.latency_ms,
            "tool_calls": tools,
            "text": _cut(p.message.text),
        }

    def view(self, now_ns: int | None = None) -> dict[str, Any]:
        """The run as one JSON object (what ``amb watch --json`` prints)."""
        now = time.time_ns() if now_ns is None else now_ns
        elapsed = remaining = None
        if self.started_ns is not None:
            elapsed = round(((self.finished_ns or now) - self.started_ns) / 1e9, 1)
            if self.time_limit_s is not None and self.finished_ns is None:
                remaining = round(max(self.time_limit_s - elapsed, 0.0), 1)
        return {
            "run_id": self.run_id,
            "status": self.status,
            "reason": self.reason,
            "task": self.task,
            "agent": self.agent,
            "model": self.model,
            "step": self.model_calls,
            "model_calls": self.model_calls,
            "failed_calls": self.failed_calls,
            "tokens": dict(self.tokens),
            "cost_usd": self.cost_usd,
            "cost_reason": self.cost_reason,
            "last_model_call": self.last_model_call,
            "tool_calls": self.tool_calls,
            "tool_results": self.tool_results,
            "last_tool_call": self.last_tool_call,
            "processes_exited": self.processes_exited,
            "last_process": self.last_process,
            "files_written": self.files_written,
            "files_deleted": self.files_deleted,
            "files_renamed": self.files_renamed,
            "last_file": self.last_file,
            "submitted_files": self.submitted_files,
            "elapsed_s": elapsed,
            "remaining_s": remaining,
            "events": self.events,
            "last_event_ns": self.last_event_ns,
            "error": self.error,
        }


class RunFollower:
    """Follows every spool of one run directory (a source's spool may appear at any time).

    A spool read as written, or compressed after ingest; one dropped after ingest (only an empty
    marker left) is read once from the store that holds the run (``<root>/spool/<run>``'s root),
    and so is every source of a run with no spool directory there (``stored``: a run that came into
    the store from elsewhere, ``amb ingest --from`` or an import)."""

    def __init__(self, run_dir: Path, price: Pricer | None = None, stored: bool = False):
        self.dir = run_dir
        self.state = LiveRun(run_dir.name, price=price)
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
