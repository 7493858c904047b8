"""``amb import`` and ``amb export``: runs in from other harnesses, runs out to other tools' formats.

Import writes through the normal spool path (source ``import``), then ingests what it wrote. Each
input gets one line: imported, skipped (its run is already there) or rejected (one reason). A
rejected input leaves the store untouched; the command then exits 1 after importing the rest.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

import click

from amb.common import output_path, progress, store_option
from amb.output import emit
from recorder.importers.common import Limits, Rejected, RunBuilder, Staged, already_imported, publish, stage
from replay.export.parquet import EVENTS_PER_FILE
from replay.ingest import ingest as ingest_store
from schemas.errors import AmbError, BadInput, UsageError, quoted


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


def run_imports(
    store: str,
    inputs: Iterable[tuple[str, Callable[[], list[RunBuilder]]]],
    total: int,
    label: str,
) -> list[Outcome]:
    """Parse each input (all of it, before writing anything), write new runs, ingest them.

    Inputs are handled by a few threads; the report keeps the inputs' order. A run id is claimed
    under a lock before it is written, so the same input given twice is written once. Written runs
    are published (made durable, then given their spool's real name) in batches of
    ``PUBLISH_EVERY``: one file-system sync per batch instead of an fsync per blob."""
    tick = progress(label)
    lock = threading.Lock()
    claimed: set[str] = set()

    def handle(item: tuple[str, Callable[[], list[RunBuilder]]]) -> list[tuple[Outcome, Staged | None]]:
        name, parse = item
        try:
            runs = parse()
        except Rejected as e:
            return [(Outcome(name, "rejected", None, str(e)), None)]
        except (OSError, RecursionError) as e:
            return [(Outcome(name, "rejected", None, f"{name}: cannot read: {e}"), None)]
        out: list[tuple[Outcome, Staged | None]] = []
        for run in runs:
            with lock:
                fresh = run.run_id not in claimed and not already_imported(store, run.run_id)
                claimed.add(run.run_id)
            if not fresh:
                out.append((Outcome(name, "skipped", run.run_id, "already imported"), None))
                continue
            staged = stage(store, run)
            result = staged.imported
            detail = f"{result.events} events, {result.blobs} blobs"
            out.append((Outcome(name, "imported", run.run_id, detail), staged))
        return out

    outcomes: list[Outcome] = []
    pending: list[Staged] = []
    with ThreadPoolExecutor(max_workers=IMPORT_THREADS) as pool:
        for i, done in enumerate(pool.map(handle, inputs)):
            tick(i, total)
            for outcome, staged in done:
                outcomes.append(outcome)
                if staged is not None:
                    pending.append(staged)
            if len(pending) >= PUBLISH_EVERY:
                publish(store, pending)
                pending = []
    publish(store, pending)
    tick(total, total)
    written = [o.run_id for o in outcomes if o.status == "imported" and o.run_id]
    if written:
        ingest_store(store, written)
    return outcomes


def report(outcomes: list[Outcome], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([o._asdict() for o in outcomes], indent=2))
    else:
        emit(["input", "status", "run_id", "detail"], [tuple(o) for o in outcomes], "table")
        counts = {s: sum(1 for o in outcomes if o.status == s) for s in ("imported", "skipped", "rejected")}
        click.echo(", ".join(f"{n} {s}" for s, n in counts.items()), err=True)
    rejected = [o for o in outcomes if o.status == "rejected"]
    if rejected:
        click.echo(f"amb: error: {len(rejected)} of {len(outcomes)} inputs rejected", err=True)
        sys.exit(1)


limit_options = [
    click.option(
        "--max-line-bytes",
        type=int,
        default=Limits().max_line_bytes,
        show_default=True,
        help="Longest JSON line accepted.",
    ),
    click.option(
        "--max-file-bytes",
        type=int,
        default=Limits().max_file_bytes,
        show_default=True,
        help="Largest file accepted.",
    ),
]


def with_limits(f: Any) -> Any:
    for option in reversed(limit_options):
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
    store: str,
    dirs: tuple[str, ...],
    recursive: bool,
    as_json: bool,
    max_line_bytes: int,
    max_file_bytes: int,
) -> None:
    """Import AutoMedBench run folders (any of the five branches' layouts)."""
    from recorder.importers import automedbench

    limits = Limits(max_line_bytes, max_file_bytes)
    resolve, brief_for = _task_helpers()
    amb_version = _amb_version()
    folders = _run_folders(dirs, recursive)

    def parser(folder: Path) -> Callable[[], list[RunBuilder]]:
        return lambda: [
            automedbench.parse(
                folder, resolve_task=resolve, brief_for=brief_for, limits=limits, amb_version=amb_version
            )
        ]

    outcomes = run_imports(store, ((str(f), parser(f)) for f in folders), len(folders), "import")
    report(outcomes, as_json)


@click.group("export")
def export_group() -> None:
    """Export runs to other tools' formats (ATIF, OpenTelemetry, Parquet)."""


commands = [import_group, export_group]


@import_group.command("atif")
@store_option
@click.argument("files", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the per-input report as JSON.")
@with_limits
def import_atif(
    store: str, files: tuple[str, ...], as_json: bool, max_line_bytes: int, max_file_bytes: int
) -> None:
    """Import ATIF trajectories (a trajectory.json, or a folder holding one and its sidecar)."""
    from recorder.importers import atif

    limits = Limits(max_line_bytes, max_file_bytes)

    def parser(path: str) -> Callable[[], list[RunBuilder]]:
        return lambda: atif.parse(Path(path), limits)

    report(run_imports(store, ((f, parser(f)) for f in files), len(files), "import"), as_json)


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
def export_otel(store: str, runs: tuple[str, ...], all_runs: bool, out: str) -> None:
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
                stream.write(line(iter_events(st.con, run), _amb_version()) + "\n")
    finally:
        if stream is not sys.stdout:
            stream.close()
    tick(len(ids), len(ids))


@import_group.command("inspect")
@store_option
@click.argument("files", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the per-input report as JSON.")
@with_limits
def import_inspect(
    store: str, files: tuple[str, ...], as_json: bool, max_line_bytes: int, max_file_bytes: int
) -> None:
    """Import Inspect AI eval logs (.eval or .json; needs the `inspect` extra)."""
    try:
        import inspect_ai.log  # noqa: F401  (only to fail early with the way out)
    except ImportError as e:
        raise UsageError(
            "amb import inspect needs Inspect AI: pip install 'amb-recorder[inspect]' "
            f"(inspect-ai could not be imported: {e})"
        ) from e
    from recorder.importers import inspect_eval

    limits = Limits(max_line_bytes, max_file_bytes)
    resolve, _ = _task_helpers()

    def parser(path: str) -> Callable[[], list[RunBuilder]]:
        return lambda: inspect_eval.parse(Path(path), resolve_task=resolve, limits=limits)

    report(run_imports(store, ((f, parser(f)) for f in files), len(files), "import"), as_json)
