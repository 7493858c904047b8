"""Commands over the event store: ingest, runs, show, sql, verify, manifest, schema, generate."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import duckdb
import msgspec

from amb.common import progress, say_error, store_option, stored_only
from amb.output import emit, emit_batches
from recorder.synthetic import MAX_CALLS, MAX_SEED, generate_run
from replay import manifest as manifests
from replay import spools as spool_modes
from replay import views
from replay.ingest import ingest as ingest_store
from replay.read import iter_events, require_runs
from replay.store import DB_NAME, Store, first, open_sql, resolve, waiting_runs
from replay.summary import summaries, summary
from replay.verify import verify as verify_store
from schemas.blobpack import SUFFIX
from schemas.blobstore import BlobStore
from schemas.codec import ID_RE
from schemas.display import for_message, one_line
from schemas.errors import AmbError, NotFound, UsageError
from schemas.events import AnyPayload
from schemas.run_claim import require_free
from schemas.userfile import read_text


@click.command()
@store_option
@click.option(
    "--spools",
    type=click.Choice(spool_modes.MODES),
    envvar=spool_modes.ENV,
    default=spool_modes.DEFAULT_MODE,
    show_default=True,
    help="What becomes of a finished run's spools once ingested (except the recorder's): compress "
    "(zstd), drop, or keep as written. Env: AMB_SPOOLS.",
)
@click.argument("runs", nargs=-1)
@click.option(
    "--from",
    "sources",
    multiple=True,
    type=click.Path(file_okay=False, exists=True),
    metavar="DIR",
    help="Load from DIR instead of the store's own spools: a sweep's shared directory (one result per "
    "cell; duplicates are listed, not loaded), a single shard, or another store (merged). Repeatable.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="With --from: print what was loaded and refused as JSON."
)
def ingest(store: str, spools: str, runs: tuple[str, ...], sources: tuple[str, ...], as_json: bool) -> None:
    """Load spools into the store (all runs, or RUNS), verifying checksums and hash chains.

    A spool that fails its checks is left out (nothing of it is stored); every other one is loaded.
    Each bad spool is named, and the exit code is non-zero.
    """
    if sources:
        if runs:
            raise UsageError("give RUNS or --from DIR, not both")
        from amb.shard_ingest import ingest_from

        sys.exit(ingest_from(store, [Path(s) for s in sources], as_json=as_json, spool_mode=spools))
    _check_ingest_input(store, runs)
    try:
        report = ingest_store(store, list(runs) or None, progress=progress("ingest"), spool_mode=spools)
    except AmbError as e:
        partial = getattr(e, "report", None)
        if partial is None:
            raise
        _say_ingested(partial)
        for path, why in partial.failed:
            say_error(f"{path}: not loaded: {why}")
        sys.exit(e.exit_code)
    _say_ingested(report)


def _check_ingest_input(store: str, runs: tuple[str, ...]) -> None:
    """Something to ingest, or a store already there: a mistyped --store is not made a new, empty
    store, and a RUN with neither spools nor events is not found."""
    root = resolve(store)
    if not (root / DB_NAME).exists() and not (root / "spool").is_dir():
        raise NotFound(f"no store and no spools at {root}: nothing to ingest (check --store or AMB_STORE)")
    stored_only(store, runs)


def _say_ingested(report) -> None:
    for torn in report.torn:
        assert torn.tail is not None
        click.echo(
            f"amb: warning: {torn.path}: torn tail at byte {torn.tail.offset} ({torn.tail.length} bytes, "
            f"{torn.tail.why}); kept the {torn.frames} complete "
            f"{'blob records' if torn.path.endswith(SUFFIX) else 'events'} before it",
            err=True,
        )
    click.echo(
        f"ingested {report.events_added} new events ({report.events_read} read) from "
        f"{report.files_loaded} of {report.files_seen} spool files; runs: {len(report.runs)}"
        + (
            f"; {report.blobs_materialised} blobs from packs of unclosed recorders"
            if report.blobs_materialised
            else ""
        )
        + "".join(f"; {n} spools {what}" for what, n in report.settled.items() if n)
    )


RUN_COLUMNS = [
    "run_id",
    "task",
    "tier",
    "agent",
    "model",
    "status",
    "duration_s",
    "n_model_calls",
    "n_tool_calls",
    "n_events",
]


@click.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def runs(store: str, as_json: bool) -> None:
    """List the runs in the store (and say how many recorded runs wait for `amb ingest`)."""
    with open_sql(store) as con:
        listed = summaries(con)
        rows = [
            (s.run_id, s.task, s.tier, s.agent, s.model, s.status, s.duration_s)
            + (s.model_calls, s.tool_calls, s.events)
            for s in listed
        ]
        emit(RUN_COLUMNS, rows, "json" if as_json else "table")
        waiting = waiting_runs(resolve(store), {s.run_id for s in listed})
        if waiting:
            some = ", ".join(waiting[:3]) + (", …" if len(waiting) > 3 else "")
            click.echo(
                f"amb: {len(waiting)} more recorded run(s) wait in {resolve(store) / 'spool'} ({some}); "
                "run `amb ingest` to list them",
                err=True,
            )


def summarize(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """``amb show``'s summary: the run's summary (``replay.summary``) and what it did in detail."""
    s = summary(con, run_id)
    tools = dict(
        con.execute(
            "SELECT name, count(*) FROM tool_calls WHERE run_id = ? GROUP BY name", [run_id]
        ).fetchall()
    )
    (nonzero,) = first(
        con.execute("SELECT count(*) FROM processes WHERE run_id = ? AND exit_code <> 0", [run_id])
    ) or (0,)
    files = con.execute(
        "SELECT path, arg_max(size, seq) FROM file_writes WHERE run_id = ? GROUP BY path ORDER BY path",
        [run_id],
    ).fetchall()
    net = con.execute("SELECT count(*) FROM network_requests WHERE run_id = ?", [run_id]).fetchall()[0][0]
    # What an importer says the source did not keep (notes of kind import.limitation).
    limitations = con.execute(
        """SELECT payload->>'$.data.limitation', payload->>'$.text' FROM events
           WHERE run_id = ? AND kind = 'note' AND payload->>'$.data.kind' = 'import.limitation'
           ORDER BY source, seq""",
        [run_id],
    ).fetchall()
    return {
        **s.header(),
        "duration_s": s.duration_s,
        "labels": s.labels,
        "events": s.events,
        "model_calls": {"count": s.model_calls, "failed": s.failed_calls, "models": s.models},
        "tokens": s.tokens.shown(),
        "tool_calls": dict(sorted(tools.items())),
        "processes": {"count": s.processes, "nonzero_exit": nonzero},
        "files_written": [{"path": p, "size": size} for p, size in files],
        "network_requests": net,
        "limitations": [{"limitation": k, "text": t} for k, t in limitations],
    }


def render_summary(s: dict) -> str:
    dur = f"{s['duration_s']:.1f} s" if s["duration_s"] is not None else "?"
    mc, tk = s["model_calls"], s["tokens"]
    lines = [
        f"run       {s['run_id']}",
        f"task      {s['task'] or '-'} ({s['tier'] or '-'})",
        f"agent     {s['agent'] or '-'}   model {s['model'] or '-'}   backend {s['backend'] or '-'}",
        f"status    {s['status']} (exit {s['exit_code']})   duration {dur}   events {s['events']}",
        f"calls     {mc['count']} model calls ({mc['failed']} failed) to {', '.join(mc['models']) or '-'}",
        (
            f"tokens    in {tk['input']:,} (cache read {tk['cache_read']:,})   out {tk['output']:,} "
            f"(reasoning {tk['reasoning']:,})"
        ),
        "tools     " + (", ".join(f"{n} ×{c}" for n, c in s["tool_calls"].items()) or "none"),
        (
            f"processes {s['processes']['count']} ({s['processes']['nonzero_exit']} exited non-zero)   "
            f"network requests {s['network_requests']}"
        ),
        f"files     {len(s['files_written'])} written",
    ]
    lines += [f"          {f['path']} ({f['size']:,} B)" for f in s["files_written"][:20]]
    if len(s["files_written"]) > 20:
        lines.append(f"          … and {len(s['files_written']) - 20} more")
    for lim in s.get("limitations", []):
        lines.append(f"limited   {lim['limitation']}: {lim['text']}")
    if s["labels"]:
        lines.append("labels    " + ", ".join(f"{k}={v}" for k, v in sorted(s["labels"].items())))
    # Names, paths and labels are the agent's text: each line printable, no escape for a terminal.
    return "\n".join(one_line(line) for line in lines)


@click.command()
@store_option
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--events", "with_events", is_flag=True, help="Also list every event (with --json: typed payloads)."
)
def show(store: str, run: str, as_json: bool, with_events: bool) -> None:
    """A readable summary of one run."""
    with open_sql(store) as con:
        require_runs(con, [run], resolve(store))
        shown = summarize(con, run)
        if with_events:
            events = list(iter_events(con, run))
            if as_json:
                shown["event_list"] = [msgspec.to_builtins(e) for e in events]
        if as_json:
            click.echo(json.dumps(shown, indent=2))
            return
        click.echo(render_summary(shown))
        if with_events:
            emit(["source", "seq", "kind", "ts_ns"], [(e.source, e.seq, e.kind, e.ts_ns) for e in events])


SQL_BATCH = 10_000
"""Rows fetched at a time by ``amb sql``."""


@click.command()
@store_option
@click.argument("query")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)
def sql(store: str, query: str, fmt: str) -> None:
    """Run a read-only SQL query (no writes, no file or network access)."""
    with open_sql(store) as con:
        try:
            cur = con.execute(query)
            if cur is None:  # nothing but blanks, comments or semicolons
                raise UsageError(
                    'no statement in the query: give one, e.g. amb sql "SELECT count(*) FROM runs"'
                )
            columns = [d[0] for d in cur.description] if cur.description else []
            # Fetched as written: a result of millions of rows is never held whole (CSV, JSON).
            batches = iter(lambda: cur.fetchmany(SQL_BATCH), []) if columns else iter([])
            emit_batches(columns, batches, fmt)
        except duckdb.Error as e:
            first = str(e).splitlines()[0]
            raise AmbError(f"query refused or failed: {first}") from e


@click.command()
@store_option
@click.argument("runs", nargs=-1)
@click.option(
    "--manifest",
    "manifest_file",
    type=click.Path(dir_okay=False, exists=True),
    help="Check against manifests kept elsewhere (JSON object, list, or one per line).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the problems as JSON.")
def verify(store: str, runs: tuple[str, ...], manifest_file: str | None, as_json: bool) -> None:
    """Re-derive every hash and check chains, manifests and blobs; exit 1 on any problem."""
    anchored = _read_manifests(manifest_file) if manifest_file else None
    with Store.open(store, read_only=True) as st:
        run_ids = require_runs(st.con, runs, st.root) or None
        problems = verify_store(st.con, st.blobs, run_ids, anchored, progress("verify blobs"))
        # What was verified: the runs named (each once), else every run.
        (n_runs, n_events), *_ = st.con.execute(
            "SELECT count(DISTINCT run_id), count(*) FROM events"
            + (" WHERE run_id IN (SELECT unnest(?))" if run_ids else ""),
            [run_ids] if run_ids else [],
        ).fetchall()
    if as_json:
        click.echo(json.dumps([p._asdict() | {"message": str(p)} for p in problems], indent=2))
    if problems:
        if not as_json:
            click.echo(f"FAIL {problems[0]}")
            for p in problems[1:10]:
                click.echo(f"     {p}")
            if len(problems) > 10:
                click.echo(f"     … {len(problems) - 10} more problems")
        raise SystemExit(1)
    if not as_json:
        click.echo(f"OK {n_events} events verified in {n_runs} run{'' if n_runs == 1 else 's'}")


def _read_manifests(path: str) -> list[dict]:
    text = read_text(Path(path), "--manifest").strip()
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}: not a manifest (JSON object, list, or JSON lines): {e}") from e


@click.command()
@store_option
@click.argument("run")
def manifest(store: str, run: str) -> None:
    """Print a finished run's manifest, to anchor outside the store."""
    with open_sql(store) as con:
        require_runs(con, [run], resolve(store))
        m = manifests.stored(con, run)
        if m is None:
            raise AmbError(f"run {run!r} has not finished (no run.finished event yet)")
        click.echo(json.dumps(m, sort_keys=True))


@click.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "ddl", "md"]),
    default="json",
    show_default=True,
    help="json: JSON Schema of the event payloads; ddl: the SQL views; md: the views' columns.",
)
def schema(fmt: str) -> None:
    """Print the event schema or the SQL views."""
    if fmt == "json":
        click.echo(json.dumps(msgspec.json.schema(AnyPayload), indent=2))
    elif fmt == "ddl":
        click.echo(";\n\n".join(views.ddl()) + ";")
    else:
        click.echo(views.markdown())


def _count_option(name: str, default: int, low: int, high: int | None, help_text: str) -> Any:
    return click.option(
        name, default=default, show_default=True, type=click.IntRange(low, high), help=help_text
    )


@click.command()
@store_option
@click.option(
    "--runs", "n_runs", default=5, show_default=True, type=click.IntRange(min=1), help="How many runs."
)
@_count_option(
    "--calls",
    35,
    1,
    MAX_CALLS,
    "Model calls per run (each request carries the whole conversation so far: it grows as calls²).",
)
@_count_option(
    "--seed", 0, 0, MAX_SEED, "Seed of the first run (run i uses seed+i; it also sets the run's clock)."
)
@click.option("--prefix", default="synth", show_default=True, help="Run id prefix (ids are PREFIX-SEED).")
@click.option(
    "--processes-per-call",
    default=1,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Processes the shim sees per tool call (a big run without a quadratic conversation).",
)
def generate(store: str, n_runs: int, calls: int, seed: int, prefix: str, processes_per_call: int) -> None:
    """Write synthetic runs through the real spool path (then run `amb ingest`).

    Run ids the store already holds are refused (exit 2) before anything is written: runs are never
    merged or reused in place, so a second `amb generate` into one store needs another --seed or
    --prefix."""
    if seed + n_runs - 1 > MAX_SEED:
        raise UsageError(f"--seed {seed} with --runs {n_runs} goes past the largest seed, {MAX_SEED}")
    ids = [f"{prefix}-{seed + i:04d}" for i in range(n_runs)]
    for run_id in (ids[0], ids[-1]):
        if not ID_RE.match(run_id):
            raise UsageError(
                f"--prefix {for_message(prefix, 140)!r} makes the run id {for_message(run_id, 160)!r}: "
                "use 1-128 of letters, digits, '.', '_', ':', '-'"
            )
    way_out = "pick other ids with --seed or --prefix"
    for run_id in ids:  # all of them before the first is written
        require_free(store, run_id, way_out)
    tick = progress("generate")
    blobs = BlobStore(Path(store) / "blobs")  # in use throughout: the runs share one pack
    for i, run_id in enumerate(ids):
        tick(i, n_runs)
        generate_run(store, run_id, seed=seed + i, calls=calls, processes_per_call=processes_per_call)
    blobs.close()
    tick(n_runs, n_runs)
    click.echo(f"wrote {n_runs} synthetic runs into {store}/spool")


commands = [ingest, runs, show, sql, verify, manifest, schema, generate]
