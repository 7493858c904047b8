"""``amb import`` and ``amb export``: runs in from other harnesses, runs out to other tools' formats.

Import writes through the normal spool path (source ``import``), then ingests what it wrote. Each
input gets one line: imported, skipped (the store holds this very run already) or rejected (one
reason, also on stderr in full). A rejected input leaves the store untouched; the command then
exits 2 (bad input) after importing the rest. A run id the store holds for another run is never
written into (``schemas.run_claim``): ``--run-id``/``--id-suffix`` import under a new id.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

import click
import duckdb

from amb.common import output_path, progress, say_error, store_option
from amb.output import emit
from recorder.importers.common import ImportCaps, Rejected, RunBuilder, Staged, publish, spool_bytes, stage
from recorder.importers.values import shown
from replay import spools
from replay.export.parquet import EVENTS_PER_FILE
from replay.ingest import ingest as ingest_store
from replay.store import DB_NAME, Store
from schemas.codec import ID_RE
from schemas.display import for_message
from schemas.errors import AmbError, BadInput, RunExists, UsageError, quoted
from schemas.run_claim import held_spools, taken_message


class Outcome(NamedTuple):
    input: str
    status: str
    """``imported``, ``skipped`` or ``rejected``."""
    run_id: str | None
    detail: str


def _amb_version() -> str:
    try:
        return version("amb-recorder")
    except Exception:  # an uninstalled checkout still imports
        return ""


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
    rejected = [o for o in outcomes if o.status == "rejected"]
    for o in rejected:
        say_error(o.detail)
    if rejected:
        sys.exit(BadInput.exit_code)


renaming_options = [
    click.option(
        "--run-id",
        "new_run_id",
        metavar="NEW",
        help="Import the one run of the one input under the id NEW (for a store that holds its own id).",
    ),
    click.option(
        "--id-suffix",
        metavar="SUFFIX",
        help="Import every run under its own id followed by SUFFIX (e.g. -2); a sub-agent's parent_run "
        "label follows its parent. The run.started label renamed_from keeps the id the input gave.",
    ),
]

limit_options = [
    click.option(
        "--max-line-bytes",
        type=click.IntRange(min=1),
        default=ImportCaps().max_line_bytes,
        show_default=True,
        help="Longest JSON line accepted.",
    ),
    click.option(
        "--max-file-bytes",
        type=click.IntRange(min=1),
        default=ImportCaps().max_file_bytes,
        show_default=True,
        help="Largest file accepted.",
    ),
]


def with_limits(f: Any) -> Any:
    for option in reversed(limit_options + renaming_options):
        f = option(f)
    return f


def _task_helpers() -> tuple[Callable[[str], str], Callable[[str, str], str | None]]:
    from tasks.registry import brief, canonical_id

    def brief_for(task: str, tier: str) -> str | None:
        try:
            return brief(task, tier)
        except AmbError:
            return None

    return canonical_id, brief_for


FileParser = Callable[[Path, ImportCaps], list[RunBuilder]]
"""Reads one input file (or folder) into its runs, nothing written."""


RUN_MARKERS = (
    "process/trace.jsonl",
    "process/conversation.json",
    "process/api_responses.jsonl",
    "workspace/process",
)


def _run_folders(paths: tuple[str, ...], recursive: bool) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if recursive and p.is_dir() and not any((p / m).exists() for m in RUN_MARKERS):
            found = sorted(
                {
                    q.parent.parent
                    for m in ("trace.jsonl", "conversation.json")
                    for q in p.rglob(f"process/{m}")
                }
            )
            found = [q.parent if q.name == "workspace" else q for q in found]
            out += sorted(set(found)) or [p]
        else:
            out.append(p)
    return out


@click.group("import")
def import_group() -> None:
    """Import runs recorded by other harnesses (written as source `import`, then ingested)."""


@import_group.command("automedbench")
@store_option
@click.argument("dirs", nargs=-1, required=True)
@click.option("-r", "--recursive", is_flag=True, help="Find run folders below each DIR.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-input report as JSON.")
@with_limits
def import_automedbench(
    store: str, dirs: tuple[str, ...], recursive: bool, as_json: bool, **options: Any
) -> None:
    """Import AutoMedBench run folders (any of the five branches' layouts).

    A run id the store already holds for another run is refused (exit 2): runs are never merged or
    reused in place. Import such a run under a new id with --run-id or --id-suffix."""
    from recorder.importers import automedbench

    resolve, brief_for = _task_helpers()
    amb_version = _amb_version()

    def parse(folder: Path, limits: ImportCaps) -> list[RunBuilder]:
        return [
            automedbench.parse(
                folder, resolve_task=resolve, brief_for=brief_for, limits=limits, amb_version=amb_version
            )
        ]

    import_inputs(store, [str(f) for f in _run_folders(dirs, recursive)], parse, as_json, **options)


def import_inputs(
    store: str,
    names: list[str],
    parse: FileParser,
    as_json: bool,
    *,
    max_line_bytes: int,
    max_file_bytes: int,
    new_run_id: str | None,
    id_suffix: str | None,
) -> None:
    """Import every input (a file or folder named as given) with ``parse``; report; exit 2 if any
    was rejected."""
    limits = ImportCaps(max_line_bytes, max_file_bytes)
    renaming = Renaming.of(new_run_id, id_suffix, len(names))

    def parser(name: str) -> Callable[[], list[RunBuilder]]:
        return lambda: parse(Path(name), limits)

    report(run_imports(store, ((n, parser(n)) for n in names), len(names), "import", renaming), as_json)


@click.group("export")
def export_group() -> None:
    """Export runs to other tools' formats (ATIF, OpenTelemetry, Parquet)."""


commands = [import_group, export_group]


def files_command(name: str, help_text: str, make_parser: Callable[[], FileParser]) -> click.Command:
    """``amb import NAME FILE...``: every input file through ``make_parser()`` (called once, before
    any file is read: where a missing extra is reported)."""

    @import_group.command(name, help=help_text)
    @store_option
    @click.argument("files", nargs=-1, required=True)
    @click.option("--json", "as_json", is_flag=True, help="Print the per-input report as JSON.")
    @with_limits
    def command(store: str, files: tuple[str, ...], as_json: bool, **options: Any) -> None:
        import_inputs(store, list(files), make_parser(), as_json, **options)

    return command


def _atif_parser() -> FileParser:
    from recorder.importers import atif

    return atif.parse


import_atif = files_command(
    "atif",
    """Import ATIF trajectories (a trajectory.json, or a folder holding one and its sidecar).

    A run id the store already holds for another run is refused (exit 2): runs are never merged or
    reused in place. A folder `amb export atif` wrote keeps its run's id, so importing it into the
    store it came from needs a new id: --run-id NEW (or --id-suffix SUFFIX for many).""",
    _atif_parser,
)


def _resolve_runs(store: str, runs: tuple[str, ...], all_runs: bool) -> list[str]:
    from replay.read import require_runs, run_ids
    from replay.store import open_sql, resolve

    con = open_sql(store)
    try:
        if all_runs:
            return run_ids(con)
        if not runs:
            raise UsageError("name the runs to export (or --all)")
        return require_runs(con, runs, resolve(store))
    finally:
        con.close()


@export_group.command("atif")
@store_option
@click.argument("runs", nargs=-1)
@click.option("--all", "all_runs", is_flag=True, help="Export every run.")
@click.option(
    "--version", "atif_version", type=click.Choice(["1.8", "1.6"]), default="1.8", show_default=True
)
@click.option(
    "--out",
    "out",
    default="atif",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder that gets <run>/trajectory.json, events.jsonl and blobs/.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the written folders as JSON.")
def export_atif(
    store: str, runs: tuple[str, ...], all_runs: bool, atif_version: str, out: str, as_json: bool
) -> None:
    """Export runs as ATIF trajectories (plus a sidecar of the events ATIF has no slot for)."""
    from replay.export.atif import export_run
    from replay.store import Store

    output_path(out, "--out", folder=True)
    ids = _resolve_runs(store, runs, all_runs)
    tick = progress("export atif")
    written = []
    with Store.open(store, read_only=True) as st:
        for i, run in enumerate(ids):
            tick(i, len(ids))
            folder = export_run(st.con, st.blobs.get, run, Path(out), atif_version)
            written.append({"run_id": run, "folder": str(folder)})
    tick(len(ids), len(ids))
    if as_json:
        click.echo(json.dumps(written, indent=2))
    else:
        emit(["run_id", "folder"], [(w["run_id"], w["folder"]) for w in written], "table")


@export_group.command("parquet")
@store_option
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--runs", "runs", multiple=True, help="Export only this run (repeatable). Default: every run.")
@click.option(
    "--events-per-file",
    type=click.IntRange(min=1),
    default=EVENTS_PER_FILE,
    show_default=True,
    help="Runs (in run-id order) are grouped into files of events of at least this many events.",
)
@click.option("--overwrite", is_flag=True, help="Replace what OUT holds.")
@click.option("--json", "as_json", is_flag=True, help="Print rows per table as JSON.")
def export_parquet(
    store: str, out: str, runs: tuple[str, ...], events_per_file: int, overwrite: bool, as_json: bool
) -> None:
    """Export events (hive-partitioned by run group, indexed by event_groups), every view and the
    score tables as Parquet."""
    from replay.export.parquet import export
    from replay.store import Store

    try:
        out.encode("utf-8")
    except UnicodeEncodeError:  # a name holding bytes that are not UTF-8 (surrogate escapes)
        raise BadInput(f"OUT {quoted(out)}: DuckDB writes Parquet under names of UTF-8 text only") from None
    output_path(out, "OUT", folder=True)
    ids = _resolve_runs(store, runs, not runs)
    with Store.open(store, read_only=True) as st:
        written = export(
            st.con,
            Path(out),
            ids if runs else None,
            progress("export parquet"),
            overwrite=overwrite,
            events_per_file=events_per_file,
        )
    rows = [(w.name, w.rows, "run_group" if w.partitioned else "-") for w in written]
    if as_json:
        click.echo(json.dumps([w._asdict() for w in written], indent=2))
    else:
        emit(["table", "rows", "partitioned_by"], rows, "table")


@export_group.command("otel")
@store_option
@click.argument("runs", nargs=-1)
@click.option("--all", "all_runs", is_flag=True, help="Export every run.")
@click.option("--out", "out", default="-", show_default=True, help="OTLP JSON lines file ('-': stdout).")
@click.option(
    "--messages",
    "with_messages",
    is_flag=True,
    help="Also give each model call's span its messages (gen_ai.input.messages, gen_ai.output.messages;"
    " every call repeats its conversation, so the file grows with its square).",
)
def export_otel(store: str, runs: tuple[str, ...], all_runs: bool, out: str, with_messages: bool) -> None:
    """Export runs as OpenTelemetry GenAI spans (OTLP JSON lines, one line per run)."""
    from replay.export.otel import line
    from replay.read import iter_events
    from replay.store import Store

    if out != "-":
        output_path(out, "--out")
    ids = _resolve_runs(store, runs, all_runs)
    tick = progress("export otel")
    stream = sys.stdout if out == "-" else open(out, "w", encoding="utf-8")
    try:
        with Store.open(store, read_only=True) as st:
            for i, run in enumerate(ids):
                tick(i, len(ids))
                reader = st.blobs.get if with_messages else None
                stream.write(line(iter_events(st.con, run), _amb_version(), reader) + "\n")
    finally:
        if stream is not sys.stdout:
            stream.close()
    tick(len(ids), len(ids))


def _inspect_parser() -> FileParser:
    try:
        import inspect_ai.log  # noqa: F401  (only to fail early with the way out)
    except ImportError as e:
        raise UsageError(
            "amb import inspect needs Inspect AI: pip install 'amb-recorder[inspect]' "
            f"(inspect-ai could not be imported: {e})"
        ) from e
    from recorder.importers import inspect_eval

    resolve, _ = _task_helpers()
    return lambda path, limits: inspect_eval.parse(path, resolve_task=resolve, limits=limits)


import_inspect = files_command(
    "inspect",
    """Import Inspect AI eval logs (.eval or .json; needs the `inspect` extra).

    A run id the store already holds for another run is refused (exit 2): runs are never merged or
    reused in place. Import such runs under new ids with --id-suffix (--run-id for a one-sample log).""",
    _inspect_parser,
)
