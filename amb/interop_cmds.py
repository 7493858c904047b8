"""``amb import`` and ``amb export``: runs in from other harnesses, runs out to other tools' formats.

The import engine is ``amb.imports``; a rejected input leaves the store untouched, and the command
then exits 2 (bad input) after importing the rest.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

import click

from amb.common import int_option, output_path, progress, store_option
from amb.imports import Renaming, report, run_imports
from amb.output import emit
from recorder.importers.common import ImportCaps, RunBuilder
from replay.export.parquet import EVENTS_PER_FILE, export
from replay.read import iter_events, require_runs, run_ids
from replay.store import Store, open_sql, resolve
from schemas.errors import AmbError, BadInput, UsageError, quoted
from schemas.ostext import is_utf8


def _amb_version() -> str:
    try:
        return version("amb-recorder")
    except Exception:  # an uninstalled checkout still imports
        return ""


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
    int_option(f"--max-{unit}-bytes", getattr(ImportCaps(), f"max_{unit}_bytes"), 1, None, help_text)
    for unit, help_text in (("line", "Longest JSON line accepted."), ("file", "Largest file accepted."))
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
            found = {
                q.parent.parent for m in ("trace.jsonl", "conversation.json") for q in p.rglob(f"process/{m}")
            }
            out += sorted({q.parent if q.name == "workspace" else q for q in found}) or [p]
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
    inputs = ((n, partial(parse, Path(n), limits)) for n in names)
    report(run_imports(store, inputs, len(names), "import", renaming), as_json)


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
@int_option(
    "--events-per-file",
    EVENTS_PER_FILE,
    1,
    None,
    "Runs (in run-id order) are grouped into files of events of at least this many events.",
)
@click.option("--overwrite", is_flag=True, help="Replace what OUT holds.")
@click.option("--json", "as_json", is_flag=True, help="Print rows per table as JSON.")
def export_parquet(
    store: str, out: str, runs: tuple[str, ...], events_per_file: int, overwrite: bool, as_json: bool
) -> None:
    """Export events (hive-partitioned by run group, indexed by event_groups), every view and the
    score tables as Parquet."""
    if not is_utf8(out):  # a name holding bytes that are not UTF-8 (surrogate escapes)
        raise BadInput(f"OUT {quoted(out)}: DuckDB writes Parquet under names of UTF-8 text only")
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
    from replay.export.otel import write_line

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
                write_line(stream, iter_events(st.con, run), _amb_version(), reader)
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
