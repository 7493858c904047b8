"""What every importer shares: safe reading of foreign files, the in-memory run, the atomic write.

Foreign files are hostile until read: every file is opened only if it is a regular file inside the
folder being imported (a symlink that resolves outside it is refused), JSON lines are read with a
per-line cap (a 2 GB line is refused after reading cap+1 bytes, never loaded), and whole files with
a size cap. Every refusal is a ``Rejected`` naming the file and the reason.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from recorder.importers.values import OUTSIDE, TS_MAX, Rejected, check_text, not_unicode, shown, when
from recorder.runlock import process_alive
from recorder.spool import spool_path
from schemas.blob import BlobRef, digest
from schemas.blobstore import BlobStore
from schemas.codec import GENESIS, encode_payload, hash_body, make_body
from schemas.display import for_message
from schemas.durable import fsync_dir
from schemas.errors import SpoolError
from schemas.events import Note, Payload, RunStarted, kind_of
from schemas.frames import MAGIC, encode_frame
from schemas.providers import SYNTHETIC_MEDIA
from schemas.run_claim import claiming, held_spools, require_free
from schemas.untrusted_json import loads_untrusted

SOURCE = "import"
"""The spool source of every imported event."""

LIMITATION = "import.limitation"
"""``note.data.kind`` of a note that states what the source did not keep."""

ORIGIN_SCORES = "origin_scores"
"""``note.data.kind`` of a note that points at the source harness's own scores (kept, never used)."""


T = TypeVar("T")

TaskResolver = Callable[[str], str]
"""Maps a foreign task name (``kidney-seg-task``, ``kidney``) to the project's task id."""


class ImportCaps(NamedTuple):
    """How much of a foreign file an importer reads at the most (``amb import --max-line-bytes``,
    ``--max-file-bytes``): a hostile input cannot make it hold more."""

    max_line_bytes: int = 64 << 20
    """Longest JSON line read from a .jsonl file."""
    max_file_bytes: int = 1 << 30
    """Largest single file read (a JSON document, a submission file)."""


DEFAULT_CAPS = ImportCaps()


def inside(root: Path, path: Path) -> bool:
    """True when ``path`` (after resolving every symlink) is the resolved ``root`` or below it.

    A path spelled below ``root`` with no ``..`` and no symlink below ``root`` is inside without
    resolving it from ``/`` (that cost most of an import's parse time); anything else is resolved."""
    cur, path_s = str(root).rstrip("/"), str(path)
    if path_s.startswith(cur + "/") and "/../" not in path_s + "/":
        try:
            for part in path_s[len(cur) + 1 :].split("/"):
                if part in ("", "."):
                    continue
                cur += "/" + part
                if stat.S_ISLNK(os.lstat(cur).st_mode):
                    break
            else:
                return True
        except OSError:
            return False
    try:
        path.resolve(strict=True).relative_to(root)
    except (ValueError, OSError):
        return False
    return True


def check_file(root: Path, path: Path, limits: ImportCaps) -> int:
    """The size of ``path`` once it is known to be a regular file inside ``root`` under the cap."""
    rel = shown(path)
    if not inside(root, path):
        raise Rejected(f"{rel}: links outside the folder being imported")
    if not path.is_file():
        raise Rejected(f"{rel}: not a regular file")
    size = path.stat().st_size
    if size > limits.max_file_bytes:
        raise Rejected(f"{rel}: {size} bytes, over the {limits.max_file_bytes}-byte cap")
    return size


def read_bytes(root: Path, path: Path, limits: ImportCaps) -> bytes:
    check_file(root, path, limits)
    return path.read_bytes()


def read_text(root: Path, path: Path, limits: ImportCaps) -> str:
    data = read_bytes(root, path, limits)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Rejected(f"{shown(path)}: not UTF-8 text ({e.reason} at byte {e.start})") from e


def read_json(root: Path, path: Path, limits: ImportCaps) -> Any:
    text = read_text(root, path, limits)
    try:
        doc = loads_untrusted(text)
    except ValueError as e:
        raise Rejected(f"{shown(path)}: not JSON ({e})") from e
    check_text(text, doc, shown(path))
    return doc


def read_jsonl(root: Path, path: Path, limits: ImportCaps) -> list[dict[str, Any]]:
    """Every line of a JSON-lines file as an object; a long, non-JSON or non-object line rejects it
    (a last line a killed harness cut mid-write too: its record cannot be trusted)."""
    check_file(root, path, limits)
    rel = shown(path)
    out: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        n = 0
        while True:
            line = f.readline(limits.max_line_bytes + 1)
            if not line:
                break
            n += 1
            if len(line) > limits.max_line_bytes:
                raise Rejected(f"{rel}: line {n} is longer than the {limits.max_line_bytes}-byte line cap")
            if not line.strip():
                continue
            try:
                record = loads_untrusted(line)
            except ValueError as e:
                raise Rejected(f"{rel}: line {n}: not JSON ({e})") from e
            if not isinstance(record, dict):
                raise Rejected(f"{rel}: line {n}: not a JSON object")
            check_text(line, record, f"{rel}: line {n}")
            out.append(record)
    return out


def convert(doc: Any, into: type[T], where: str) -> T:
    """A decoded JSON document as the Structs of its format (``msgspec.convert``, strict): a part
    of the wrong shape refuses the input, naming where in the document it is."""
    try:
        return msgspec.convert(doc, into)
    except msgspec.ValidationError as e:
        what, _, at = str(e).partition(" - at `$")
        at = at.removesuffix("`").lstrip(".")
        raise Rejected(f"{where}: {at + ': ' if at else ''}{what}") from None


def walk_files(root: Path, top: Path, limits: ImportCaps) -> Iterator[tuple[str, Path]]:
    """(path relative to ``top``, path) of every file below ``top``, sorted; symlinks leading out
    of ``root`` and oversized files reject the whole input."""
    if not top.is_dir():
        return
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        d = Path(dirpath)
        for name in list(dirnames):
            if (d / name).is_symlink():
                # A linked directory is not walked; one that leads out of the folder is refused.
                if not inside(root, d / name):
                    raise Rejected(f"{shown(d / name)}: links outside the folder being imported")
                dirnames.remove(name)
        for name in filenames:
            p = d / name
            check_file(root, p, limits)
            found.append((p.relative_to(top).as_posix(), p))
    yield from sorted(found)


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (foreign files have any shape)."""
    return value if isinstance(value, dict) else {}


class Imported(NamedTuple):
    run_id: str
    events: int
    blobs: int


class RunBuilder:
    """One run's events and blobs, built in memory, written in one go.

    Timestamps are kept non-decreasing in emit order: readers order a run by ``(ts_ns, source,
    seq)``, and a source's relative clock may run backwards between its files, so an event never
    gets a timestamp before the previous one (``clamped`` counts how often that happened).
    ``origin`` names the input (``values.shown``) in the reasons a run is refused for."""

    def __init__(self, run_id: str, origin: str = ""):
        self.run_id = run_id
        self.origin = origin
        self.events: list[tuple[int, Payload]] = []
        self.blobs: dict[str, bytes] = {}
        self.clamped = 0
        self._last_ts = 0

    def blob(self, data: bytes, media_type: str) -> BlobRef:
        ref = BlobRef(blob=digest(data), size=len(data), media_type=media_type)
        self.blobs.setdefault(ref.blob, data)
        return ref

    def json_blob(self, value: Any, media_type: str = SYNTHETIC_MEDIA) -> BlobRef:
        try:
            data = json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise Rejected(f"{self.origin}: {not_unicode(value)}") from None
        return self.blob(data, media_type)

    def emit(self, payload: Payload, ts_ns: int) -> int:
        if ts_ns < self._last_ts:
            self.clamped += 1
            ts_ns = self._last_ts
        self._last_ts = ts_ns
        self.events.append((ts_ns, payload))
        return ts_ns

    @property
    def last_ts(self) -> int:
        return self._last_ts

    def note(self, text: str, kind: str, ts_ns: int | None = None, **data: Any) -> None:
        self.emit(Note(text=text, data={"kind": kind, **data}), self._last_ts if ts_ns is None else ts_ns)

    def limitation(self, what: str, text: str, **data: Any) -> None:
        """State something the source did not keep (``what`` is a short stable key)."""
        self.note(text, LIMITATION, limitation=what, **data)

    def note_clamps(self) -> None:
        """State how many of the source's timestamps ran backwards (each held at the one before)."""
        if self.clamped:
            self.note(
                f"{self.clamped} timestamps of the source ran backwards and were held at the previous one",
                "import.clock",
                clamped=self.clamped,
            )

    def rename(self, run_id: str, renamed: dict[str, str]) -> None:
        """Give the run the id ``run_id``, stated in its ``run.started`` (label ``renamed_from``: the id
        the source gave it); ``renamed`` maps the input's other runs' old ids to their new ones, so
        a sub-agent's ``parent_run`` label follows its parent."""
        old, self.run_id = self.run_id, run_id
        for i, (ts, payload) in enumerate(self.events):
            if isinstance(payload, RunStarted):
                labels = dict(payload.labels, renamed_from=old)
                if labels.get("parent_run") in renamed:
                    labels["parent_run"] = renamed[labels["parent_run"]]
                self.events[i] = (ts, msgspec.structs.replace(payload, labels=labels))


class Staged(NamedTuple):
    """A run written but not yet visible: its spool sits under a ``.partial`` name."""

    imported: Imported
    partial: Path
    final: Path


PARTIAL = re.compile(r"^import\.spool(?:\.(\d+))?\.partial$")
"""A staged spool: ``import.spool.<pid>.partial`` (one per importing process, so two imports of one
id never write one file), which ingest never reads."""


def stage(store: str | os.PathLike[str], run: RunBuilder, data: bytes) -> Staged:
    """Blobs (made durable by one flush), then the spool ``data`` (``spool_bytes(run)``) under a
    temporary name that ingest never reads; ``publish`` syncs it and gives it its real name."""
    blobs = BlobStore(Path(store) / "blobs")
    for blob in run.blobs.values():
        blobs.put(blob, sync=False)
    blobs.flush()
    final = spool_path(store, run.run_id, SOURCE)
    _remove_dead_partials(final.parent)
    tmp = final.with_name(f"{final.name}.{os.getpid()}.partial")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(data)
    return Staged(Imported(run.run_id, len(run.events), len(run.blobs)), tmp, final)


def _remove_dead_partials(run_dir: Path) -> None:
    """Remove what imports that died mid-write left in ``run_dir`` (their process is gone)."""
    try:
        names = os.listdir(run_dir)
    except FileNotFoundError:
        return
    for name in names:
        m = PARTIAL.match(name)
        if m and (m.group(1) is None or not process_alive(int(m.group(1)), None)):
            (run_dir / name).unlink(missing_ok=True)


def spool_bytes(run: RunBuilder) -> bytes:
    """The whole spool file of ``run``, as ``SpoolWriter`` would append it event by event (same
    bodies, hash chain and frames; ingest checks every one), in one buffer for one write.

    This is also the last check of the whole run before a byte of it is written: it starts with
    ``run.started`` (so no event is dated before the run's start), every time is one the store
    holds, every number fits 64 bits, every text encodes and every event fits a frame; anything
    else refuses the input (``Rejected``, naming it and the event)."""
    if not run.events or not isinstance(run.events[0][1], RunStarted):
        first = kind_of(type(run.events[0][1])) if run.events else "nothing"
        start = next((ts for ts, p in run.events if isinstance(p, RunStarted)), None)
        raise Rejected(
            f"{run.origin}: a {first} event comes before the run's start"
            + (f" ({when(run.events[0][0])}, the run starts {when(start)})" if start is not None else "")
        )
    frames = [MAGIC]
    prev = GENESIS
    for seq, (ts, payload) in enumerate(run.events):
        kind = kind_of(type(payload))
        if not 0 <= ts <= TS_MAX:
            raise Rejected(f"{run.origin}: a {kind} event at {when(ts)} {OUTSIDE}")
        try:
            encoded = encode_payload(payload)
        except UnicodeEncodeError:
            where = not_unicode(msgspec.to_builtins(payload, str_keys=True, enc_hook=repr))
            raise Rejected(f"{run.origin}: a {kind} event: {where}") from None
        if _LONG_NUMBER.search(encoded):
            _check_numbers(run.origin, kind, payload)
        body = make_body(
            run_id=run.run_id,
            source=SOURCE,
            seq=seq,
            ts_ns=ts,
            kind=kind,
            v=type(payload).VERSION,
            payload=encoded,
            prev_hash=prev,
        )
        prev = hash_body(body)
        try:
            frames.append(encode_frame(body, prev[len("sha256:") :]))
        except SpoolError as e:
            raise Rejected(f"{run.origin}: a {kind} event: {e}") from None
    return b"".join(frames)


_LONG_NUMBER = re.compile(rb"\d{19}")
"""19 digits in a row: where a number beyond 64 bits may be (or just long digits in a text)."""


def _check_numbers(origin: str, kind: str, payload: Payload) -> None:
    """Refuse a payload holding an integer beyond 64 bits (DuckDB and Arrow hold no more)."""
    stack: list[tuple[Any, str]] = [(msgspec.to_builtins(payload, str_keys=True, enc_hook=repr), "")]
    while stack:
        value, at = stack.pop()
        if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value <= TS_MAX:
            raise Rejected(
                f"{origin}: a {kind} event: {at.lstrip('.')} is {for_message(str(value), 40)}, beyond 64 bits"
            )
        if isinstance(value, dict):
            stack.extend((v, f"{at}.{for_message(str(k), 80)}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(value))


def _sync_file_system(path: Path) -> None:
    """Everything written to the file system holding ``path`` reaches the disk (``syncfs``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc is not None and _libc.syncfs(fd) == 0:
            return
        os.sync()  # no syncfs here: the whole machine's buffers, slower but as safe
    finally:
        os.close(fd)


def _load_libc() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syncfs.argtypes = [ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


def publish(store: str | os.PathLike[str], staged: list[Staged]) -> list[Staged]:
    """Make staged runs durable, then visible: one sync of the file system (every blob and spool
    of the batch on disk), each spool renamed to its real name, the renames made durable. A crash
    before the renames leaves only ``.partial`` files, removed by the next import of that run.

    The renames happen under the store's claim lock (``schemas.run_claim.claiming``), each once its
    run id is seen to be still free: a run whose id another writer took meanwhile is not published
    (its partial spool is removed) and is returned."""
    if not staged:
        return []
    _sync_file_system(Path(store))
    dirs = set()
    lost = []
    with claiming(store):
        for s in staged:
            if held_spools(store, s.imported.run_id):
                lost.append(s)
                continue
            os.replace(s.partial, s.final)
            dirs.add(s.final.parent)
    for s in lost:
        s.partial.unlink(missing_ok=True)
    for d in sorted(dirs):
        fsync_dir(d)
    return lost


def write(store: str | os.PathLike[str], run: RunBuilder) -> Imported:
    """One run, durable and visible on return (``RunExists`` when the store holds its id)."""
    require_free(store, run.run_id, "import it under another id")
    staged = stage(store, run, spool_bytes(run))
    if publish(store, [staged]):
        require_free(store, run.run_id, "import it under another id")  # taken meanwhile: raises
    return staged.imported
