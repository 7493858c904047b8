"""The import engine under ``amb import``: inputs read by a few threads, their runs claimed in the
inputs' order, written through the normal spool path, published in batches and ingested; one outcome
per input, reported as a table (or JSON) with each rejection's reason in full on stderr."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import click
import duckdb

from amb.common import exit_on, progress
from amb.output import emit
from recorder.importers.common import Rejected, RunBuilder, Staged, publish, spool_bytes, stage
from recorder.importers.values import shown
from replay import spools
from replay.ingest import ingest as ingest_store
from replay.store import DB_NAME, Store
from schemas.blobstore import BlobStore
from schemas.codec import ID_RE
from schemas.display import for_message
from schemas.errors import BadInput, RunExists, UsageError
from schemas.run_claim import held_spools, taken_message


class Outcome(NamedTuple):
    input: str
    status: str
    """``imported``, ``skipped`` or ``rejected``."""
    run_id: str | None
    detail: str


IMPORT_THREADS = 4
"""Inputs parsed and written at once: an import waits mostly on fsync (blobs, then the spool), which
threads overlap; parsing holds the GIL, so more threads than this buy nothing on a small machine."""


PUBLISH_EVERY = 64
"""Runs made durable and visible together (a crash loses at most this many, which a re-run redoes)."""

WAY_OUT = "import it under a new id with --run-id NEW (one run) or --id-suffix SUFFIX"


class Renaming(NamedTuple):
    """``--run-id`` / ``--id-suffix``: the ids the runs of an input are imported under."""

    run_id: str | None = None
    suffix: str | None = None

    @classmethod
    def of(cls, run_id: str | None, suffix: str | None, inputs: int) -> Renaming:
        if run_id is not None and suffix is not None:
            raise UsageError("give --run-id or --id-suffix, not both")
        if run_id is not None and (inputs != 1 or not ID_RE.match(run_id)):
            raise UsageError(
                f"--run-id {for_message(run_id, 140)!r}: "
                + (
                    "names the one run of one input (for several, use --id-suffix)"
                    if inputs != 1
                    else "not a run id (1-128 of letters, digits, '.', '_', ':', '-')"
                )
            )
        if suffix is not None and not ID_RE.match("x" + suffix):
            raise UsageError(
                f"--id-suffix {for_message(suffix, 140)!r}: use letters, digits, '.', '_', ':', '-' only"
            )
        return cls(run_id, suffix)

    def apply(self, runs: list[RunBuilder], where: str) -> None:
        if self.run_id is None and self.suffix is None:
            return
        if self.run_id is not None and len(runs) != 1:
            raise Rejected(
                f"{where}: holds {len(runs)} runs (sub-agent trajectories or samples) and --run-id names "
                "one: import them with --id-suffix"
            )
        new = {r.run_id: self.run_id or r.run_id + (self.suffix or "") for r in runs}
        for old, run_id in new.items():
            if not ID_RE.match(run_id):
                raise Rejected(f"{where}: run {old} renamed is {for_message(run_id, 140)!r}, not a run id")
        for r in runs:
            r.rename(new[r.run_id], new)


NO_RENAMING = Renaming()


class _InOrder:
    """Lets input ``i`` take its claims only after every earlier input has: of two inputs making one
    run, the first given is the one written (or skipped), whichever thread finished reading first.
    Never blocks for ever: the pool starts inputs in order, so every earlier input is already running."""

    def __init__(self) -> None:
        self._next = 0
        self._turns = threading.Condition()

    @contextlib.contextmanager
    def turn(self, i: int) -> Iterator[None]:
        with self._turns:
            self._turns.wait_for(lambda: self._next == i)
        try:
            yield
        finally:
            with self._turns:
                self._next += 1
                self._turns.notify_all()


class _Claims:
    """Which runs of an import are written: a run id the store does not hold, once (an input given
    twice, or two inputs making one run, are written once). A run id the store holds is skipped when
    it holds this very run (its one spool, of source ``import``, is the spool this import would
    write: the same input imported before) and refused (``RunExists``) otherwise."""

    def __init__(self, store: str):
        self.store = store
        self._lock = threading.Lock()
        self._mine: dict[str, bytes] = {}
        """Digest of the spool of every run this import claimed, by id."""
        self._con: duckdb.DuckDBPyConnection | None = None

    def take(self, where: str, built: list[tuple[RunBuilder, bytes]]) -> list[bool]:
        """Per run of one input, whether to write it (False: the store or this import has it);
        ``RunExists`` for the whole input when any of its runs' ids is taken by another run."""
        with self._lock:
            write = []
            for run, data in built:
                mine = self._mine.get(run.run_id)
                if mine is not None:
                    if mine != hashlib.sha256(data).digest():
                        raise RunExists(
                            f"{where}: run id {run.run_id!r} is also made, with other content, by another "
                            f"input of this import; runs are never merged: {WAY_OUT}"
                        )
                    write.append(False)
                    continue
                held = held_spools(self.store, run.run_id)
                why = spools.differs(Path(self.store), run.run_id, held, {"import": data}, self._stored)
                if held and why is not None:
                    raise RunExists(f"{where}: {taken_message(self.store, run.run_id, held, WAY_OUT, why)}")
                write.append(not held)
            for run, data in built:
                self._mine.setdefault(run.run_id, hashlib.sha256(data).digest())
            return write

    def _stored(self, key: str) -> spools.Head | None:
        """What the store loaded of a spool it dropped after ingest (read-only, opened on demand)."""
        if self._con is None:
            if not (Path(self.store) / DB_NAME).exists():
                return None
            self._con = Store.open(self.store, read_only=True).con
        return spools.stored_head(self._con, key)

    def close(self) -> None:
        """Before the import's ingest opens the store for writing."""
        if self._con is not None:
            self._con.close()
            self._con = None


def run_imports(
    store: str,
    inputs: Iterable[tuple[str, Callable[[], list[RunBuilder]]]],
    total: int,
    label: str,
    renaming: Renaming = NO_RENAMING,
) -> list[Outcome]:
    """Parse and check each input (all of it, before writing anything), write new runs, ingest them.

    Inputs are handled by a few threads; the report keeps the inputs' order. Written runs are
    published (made durable, then given their spool's real name) in batches of ``PUBLISH_EVERY``:
    one file-system sync per batch instead of an fsync per blob."""
    tick = progress(label)
    claims = _Claims(store)
    blobs = BlobStore(Path(store) / "blobs")  # in use throughout: the runs share one pack
    order = _InOrder()

    def handle(
        item: tuple[int, tuple[str, Callable[[], list[RunBuilder]]]],
    ) -> list[tuple[Outcome, Staged | None]]:
        i, (name, parse) = item
        where = shown(name)
        try:
            built: list[tuple[RunBuilder, bytes]] | BaseException
            try:
                runs = parse()
                renaming.apply(runs, where)
                built = [(run, spool_bytes(run)) for run in runs]
            except BaseException as e:  # raised below, once this input's turn has passed
                built = e
            with order.turn(i):
                if isinstance(built, BaseException):
                    raise built
                write = claims.take(where, built)
        except (Rejected, RunExists) as e:
            return [(Outcome(where, "rejected", None, str(e)), None)]
        except (OSError, RecursionError) as e:
            return [(Outcome(where, "rejected", None, f"{where}: cannot read: {for_message(str(e))}"), None)]
        out: list[tuple[Outcome, Staged | None]] = []
        for (run, data), new in zip(built, write, strict=True):
            if not new:
                out.append((Outcome(where, "skipped", run.run_id, "already imported"), None))
                continue
            staged = stage(store, run, data)
            result = staged.imported
            detail = f"{result.events} events, {result.blobs} blobs"
            out.append((Outcome(where, "imported", run.run_id, detail), staged))
        return out

    outcomes: list[Outcome] = []
    pending: list[Staged] = []
    lost: list[Staged] = []
    try:
        with ThreadPoolExecutor(max_workers=IMPORT_THREADS) as pool:
            for i, done in enumerate(pool.map(handle, enumerate(inputs))):
                tick(i, total)
                for outcome, staged in done:
                    outcomes.append(outcome)
                    if staged is not None:
                        pending.append(staged)
                if len(pending) >= PUBLISH_EVERY:
                    lost += publish(store, pending)
                    pending = []
        lost += publish(store, pending)
    finally:
        claims.close()
        blobs.close()
    tick(total, total)
    outcomes = _taken_meanwhile(outcomes, {s.imported.run_id for s in lost})
    written = [o.run_id for o in outcomes if o.status == "imported" and o.run_id]
    if written:
        ingest_store(store, written)
    return outcomes


def _taken_meanwhile(outcomes: list[Outcome], lost: set[str]) -> list[Outcome]:
    """Runs another process wrote under the same id while this import ran are not written: said so."""
    return [
        o._replace(
            status="rejected",
            detail=f"{o.input}: run id {o.run_id!r} was taken by another process during this import; "
            f"{WAY_OUT}",
        )
        if o.status == "imported" and o.run_id in lost
        else o
        for o in outcomes
    ]


def report(outcomes: list[Outcome], as_json: bool) -> None:
    """The per-input table (or JSON) on stdout; each rejected input's reason in full on stderr, one
    line each; exit code 2 (bad input) when any input was rejected."""
    if as_json:
        click.echo(json.dumps([o._asdict() for o in outcomes], indent=2))
    else:
        emit(["input", "status", "run_id", "detail"], [tuple(o) for o in outcomes], "table")
        counts = {s: sum(1 for o in outcomes if o.status == s) for s in ("imported", "skipped", "rejected")}
        click.echo(", ".join(f"{n} {s}" for s, n in counts.items()), err=True)
    exit_on([o.detail for o in outcomes if o.status == "rejected"], BadInput.exit_code)
