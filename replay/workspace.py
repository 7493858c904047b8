"""The agent's workspace at any moment of a run, rebuilt from its file events and blobs.

A run's file events are replayed in order up to a moment (``parse_moment``), so a moment sees a
prefix of each source's changes (``placed``). A checkout trusts nothing in the events
(docs/watch-and-checkout.md): paths are checked, files created ``O_EXCL | O_NOFOLLOW`` in a fresh
directory, every byte checked against its recorded hash; a file whose content was not kept is listed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.blob import digest
from schemas.blobstore import BlobStore
from schemas.codec import Event
from schemas.errors import NO_ROOM, AmbError, BadInput, BlobError, UsageError
from schemas.events import (
    FileDeleted,
    FileRenamed,
    FileWritten,
    ModelCallCompleted,
    SubmissionSealed,
    ToolCallResult,
)
from schemas.ostext import NotOsText, os_bytes, os_text

FILE_KINDS = ["file.written", "file.deleted", "file.renamed"]
MOMENT_KINDS = ["tool_call.result", "model_call.completed", "submission.sealed"]


class WorkspaceError(AmbError):
    """A checkout that cannot be done faithfully (a blob that fails its hash, a bad target)."""


@dataclass(frozen=True)
class Moment:
    label: str
    cut_ns: int | None
    """Changes placed at or before this time are in (None: all of them)."""
    event: tuple[str, int] | None = None
    """For ``SOURCE:SEQ``: that source's changes are in up to this seq, whatever their time."""


@dataclass
class FileState:
    path: str
    size: int | None
    sha256: str | None
    blob: str | None
    event: str
    """The event that gave the file this content (``SOURCE:SEQ``)."""
    note: str | None = None
    """Why its content is not kept (above the size cap; existed before the run)."""

    def row(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "kept": self.blob is not None,
            "event": self.event,
            "note": self.note,
        }


@dataclass
class Workspace:
    moment: Moment
    files: dict[str, FileState] = field(default_factory=dict)
    outside: dict[str, FileState] = field(default_factory=dict)
    """Absolute paths: files outside the workspace (a watched /tmp); never materialised."""
    refused: list[dict[str, str]] = field(default_factory=list)
    """Events whose paths could never be inside a workspace (traversal, empty parts)."""
    changes: int = 0


# ---- moments ----------------------------------------------------------------------------------------

_EVENT_RE = re.compile(r"([a-z][a-z0-9_-]{0,31}):([0-9]{1,18})")


def parse_moment(spec: str, events: list[Event]) -> Moment:
    """A moment named by the user, resolved against the run's events (file and moment kinds)."""
    text = spec.strip()
    if text in ("end", ""):
        return Moment("end", None)
    if text == "start":
        return Moment("start", -1)
    if text == "before-submit":
        sealed = [e for e in events if isinstance(e.payload, SubmissionSealed)]
        if not sealed:
            raise UsageError("before-submit: the run has no submission.sealed event (did it end?)")
        return Moment(f"before-submit ({sealed[-1].source}:{sealed[-1].seq})", sealed[-1].ts_ns - 1)
    if text.startswith("step:"):
        return _step(text[5:], events)
    if text.startswith("time:") or text.startswith("@"):
        iso = text[5:] if text.startswith("time:") else text[1:]
        try:
            when = dt.datetime.fromisoformat(iso)
        except ValueError:
            raise UsageError(f"time {iso!r}: not an ISO 8601 time (e.g. 2026-05-01T12:30:00Z)") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        ns = int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000
        return Moment(f"time {when.isoformat()}", ns)
    m = _EVENT_RE.fullmatch(text)
    if m is None:
        raise UsageError(
            f"moment {spec!r}: expected end, start, before-submit, step:N, time:ISO or SOURCE:SEQ"
        )
    return Moment(text, None, (m.group(1), int(m.group(2))))


def _step(n_text: str, events: list[Event]) -> Moment:
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses
    if not (n_text.isascii() and n_text.isdigit()) or len(n_text) > 18 or int(n_text) < 1:
        raise UsageError(f"step {n_text[:40]!r}: a step is a number from 1, in ASCII digits")
    n = int(n_text)
    results = [e for e in events if isinstance(e.payload, ToolCallResult)]
    results.sort(key=lambda e: (e.source, e.seq))
    if n > len(results):
        raise UsageError(f"step {n}: the run has {len(results)} tool call result(s)")
    result = results[n - 1]
    assert isinstance(result.payload, ToolCallResult)
    started = {
        e.payload.call_id: e.payload.started_ns
        for e in events
        if isinstance(e.payload, ModelCallCompleted) and e.payload.started_ns
    }
    cut = started.get(result.payload.model_call_id) or result.ts_ns
    return Moment(f"step {n} ({result.source}:{result.seq})", cut)


def event_moment(moment: Moment, all_ts: dict[tuple[str, int], int]) -> Moment:
    """A ``SOURCE:SEQ`` moment given the time of that event (looked up by the caller)."""
    assert moment.event is not None
    ts = all_ts.get(moment.event)
    if ts is None:
        raise UsageError(f"event {moment.label}: the run has no such event")
    return Moment(moment.label, ts, moment.event)


def run_events(con: Any, run_id: str) -> list[Event]:
    """A stored run's file events and the events moments are named by."""
    from replay.read import iter_events

    return list(iter_events(con, run_id, FILE_KINDS + MOMENT_KINDS))


def at_moment(con: Any | None, run_id: str, spec: str, events: list[Event]) -> Workspace:
    """The workspace at the moment ``spec`` names (``con``: the store, for ``SOURCE:SEQ`` of an
    event of another kind; None when the events came from spools)."""
    moment = parse_moment(spec, events)
    if moment.event is not None:
        known = {(e.source, e.seq): e.ts_ns for e in events}
        if moment.event not in known and con is not None:
            rows = con.execute(
                "SELECT ts_ns FROM events WHERE run_id = ? AND source = ? AND seq = ?",
                [run_id, *moment.event],
            ).fetchall()
            if rows:
                known[moment.event] = rows[0][0]
        moment = event_moment(moment, known)
    return state_at(placed(events), moment)


# ---- the fold ---------------------------------------------------------------------------------------


def placed(events: Iterable[Event]) -> list[tuple[int, Event]]:
    """File events with the time each is placed at (``changed_ns``, the kernel's date, when the shim
    recorded it, else ``ts_ns``), in the order they are applied. Each source's times are a running
    maximum in seq order, so the changes a moment includes are always a prefix of each source's."""
    by_source: dict[str, list[Event]] = {}
    for e in events:
        if e.kind in FILE_KINDS:
            by_source.setdefault(e.source, []).append(e)
    out: list[tuple[int, Event]] = []
    for source_events in by_source.values():
        source_events.sort(key=lambda e: e.seq)
        high = 0
        for e in source_events:
            changed = getattr(e.payload, "changed_ns", None)
            high = max(high, changed if changed else e.ts_ns)
            out.append((high, e))
    out.sort(key=lambda pe: (pe[0], pe[1].source, pe[1].seq))
    return out


def path_problem(path: str) -> str | None:
    """Why ``path`` (recorded text) can never name a file inside a workspace, or None."""
    if not path:
        return "empty path"
    try:
        raw = os_bytes(path)
    except NotOsText:
        return "not the recorded text of a name (see schemas.ostext)"
    if b"\0" in raw:
        return "NUL in path"
    parts = raw.split(b"/")
    if any(p in (b"", b".", b"..") for p in parts):
        return "not a plain relative path (empty, '.' or '..' part)"
    if any(len(p) > 255 for p in parts):
        return "a path part longer than 255 bytes"
    return None


def state_at(changes: list[tuple[int, Event]], moment: Moment) -> Workspace:
    ws = Workspace(moment)
    for at, e in changes:
        if moment.event is not None and e.source == moment.event[0]:
            if e.seq > moment.event[1]:
                continue
        elif moment.cut_ns is not None and at > moment.cut_ns:
            continue
        ws.changes += 1
        _apply(ws, e)
    return ws


def _apply(ws: Workspace, e: Event) -> None:
    where = f"{e.source}:{e.seq}"
    p = e.payload
    if isinstance(p, FileWritten | FileDeleted):
        target = _place(ws, p.path, where)
        if target is None:
            return
        if isinstance(p, FileDeleted):  # the file, or every file under it (a directory)
            for gone in [k for k in target if k == p.path or k.startswith(p.path + "/")]:
                target.pop(gone)
            return
        note = None if p.content is not None else "above the content size cap: only its hash was recorded"
        blob = p.content.blob if p.content is not None else None
        target[p.path] = FileState(p.path, p.size, p.sha256, blob, where, note)
    elif isinstance(p, FileRenamed):
        src_target = _place(ws, p.src, where)
        dst_target = _place(ws, p.dst, where)
        if src_target is None or dst_target is None:
            return
        # The file itself, else every file under it (a directory).
        moved = [p.src] if p.src in src_target else [k for k in src_target if k.startswith(p.src + "/")]
        for k in moved:
            new = p.dst + k[len(p.src) :]
            dst_target[new] = dataclasses.replace(src_target.pop(k), path=new)
        if not moved:
            why = f"renamed from {p.src}, which existed before the run: not recorded"
            dst_target[p.dst] = FileState(p.dst, None, None, None, where, why)


def _place(ws: Workspace, path: str, where: str) -> dict[str, FileState] | None:
    """Where a path's state lives (inside or outside the workspace), or None when refused."""
    if path.startswith("/"):
        return ws.outside if "\0" not in path else None
    problem = path_problem(path)
    if problem is not None:
        ws.refused.append({"event": where, "path": path, "reason": problem})
        return None
    return ws.files


def diff(a: Workspace, b: Workspace) -> list[dict[str, Any]]:
    """What changed between two states: added, removed, modified, renamed (same content, new path)."""
    rows: list[dict[str, Any]] = []
    removed = {p: f for p, f in a.files.items() if p not in b.files}
    added = {p: f for p, f in b.files.items() if p not in a.files}
    by_hash: dict[str, list[str]] = {}
    for p, f in sorted(removed.items()):
        if f.sha256:
            by_hash.setdefault(f.sha256, []).append(p)
    for p, f in sorted(added.items()):
        olds = by_hash.get(f.sha256 or "")
        if olds:
            old = olds.pop(0)
            del removed[old]
            rows.append(_row("renamed", p, a.files[old], f, old))
        else:
            rows.append(_row("added", p, None, f))
    for p, f in removed.items():
        rows.append(_row("removed", p, f, None))
    for p in sorted(set(a.files) & set(b.files)):
        if a.files[p].sha256 != b.files[p].sha256 or a.files[p].size != b.files[p].size:
            rows.append(_row("modified", p, a.files[p], b.files[p]))
    rows.sort(key=lambda r: (r["path"], r["change"]))
    return rows


def _row(
    change: str, path: str, a: FileState | None, b: FileState | None, old: str | None = None
) -> dict[str, Any]:
    return {
        "change": change,
        "path": path,
        "from": old,
        "size_a": a.size if a else None,
        "size_b": b.size if b else None,
        "sha256_a": a.sha256 if a else None,
        "sha256_b": b.sha256 if b else None,
        "event": b.event if b else (a.event if a else None),
    }


# ---- materialising ----------------------------------------------------------------------------------


def content_of(ws_file: FileState, blobs: BlobStore) -> bytes:
    """A kept file's bytes, checked against the hash and size its event recorded."""
    assert ws_file.blob is not None
    try:
        data = blobs.get(ws_file.blob)
    except BlobError as e:
        raise WorkspaceError(f"event {ws_file.event} ({ws_file.path}): {e}") from None
    if digest(data) != ws_file.sha256 or (ws_file.size is not None and len(data) != ws_file.size):
        raise WorkspaceError(
            f"event {ws_file.event} ({ws_file.path}): content does not match the recorded hash "
            f"{ws_file.sha256} and size {ws_file.size}"
        )
    return data


def checkout(ws: Workspace, blobs: BlobStore, target: Path) -> dict[str, Any]:
    """Write the workspace into ``target`` (absent or empty); return what was written and not."""
    target = Path(target)
    if target.is_symlink():
        raise WorkspaceError(f"{target}: is a symbolic link; give a real (new or empty) directory")
    if target.exists():
        if not target.is_dir():
            raise WorkspaceError(f"{target}: exists and is not a directory")
        if any(target.iterdir()):
            raise WorkspaceError(f"{target}: not empty; checkout writes into a new or empty directory")
    try:
        parent = target.resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
        staging = parent / f".{target.name}.amb-checkout-{os.getpid()}-{os.urandom(4).hex()}"
        os.mkdir(staging, 0o755)
    except OSError as e:
        raise BadInput(f"{target}: cannot make a folder there: {e.strerror or e}") from None
    written: list[dict[str, Any]] = []
    not_kept: list[dict[str, Any]] = []
    refused = list(ws.refused)
    total = 0
    try:
        root = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for path in sorted(ws.files):
                f = ws.files[path]
                if f.blob is None:
                    not_kept.append(f.row())
                    continue
                data = content_of(f, blobs)
                try:
                    problem = _write_under(root, path, data)
                except OSError as e:  # no room: the checkout stops, and its staging folder goes
                    raise OSError(e.errno, e.strerror, str(target / path)) from None
                if problem is not None:
                    refused.append({"event": f.event, "path": path, "reason": problem})
                    continue
                total += len(data)
                written.append({"path": path, "size": len(data), "sha256": f.sha256, "event": f.event})
        finally:
            os.close(root)
        try:
            if target.exists():
                target.rmdir()  # empty (checked above): the finished tree takes its place
            os.rename(staging, target)
        except OSError as e:
            raise BadInput(f"{target}: cannot put the checkout there: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "moment": ws.moment.label,
        "dir": str(target),
        "files": len(written),
        "bytes": total,
        "written": written,
        "not_kept": not_kept,
        "outside": [f.row() for f in ws.outside.values()],
        "refused": refused,
    }


def _write_under(root: int, path: str, data: bytes) -> str | None:
    """Create ``path`` (recorded text, checked by ``path_problem``) under the directory ``root``, by
    the exact bytes of its name, without following any link; why not, or None."""
    parts = os_bytes(path).split(b"/")
    fd = root
    opened: list[int] = []
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                return f"cannot make its directory {os_text(part)!r}: {e.strerror}"
            opened.append(fd)
        try:
            out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        except OSError as e:
            if e.errno in NO_ROOM:  # not this file's fault: every later one would fail too
                raise
            return f"cannot create it: {e.strerror}"
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
        return None
    finally:
        for d in opened:
            os.close(d)
