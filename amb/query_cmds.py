"""Commands that read the event store and change nothing: runs, show, sql, manifest, schema.

Apart from the writing commands (``amb.store_cmds``), so that these, the ones people type most,
start without importing what ingest and verify need (Arrow, numpy)."""

from __future__ import annotations

import json

import click
import duckdb
import msgspec

from amb.common import store_option
from amb.output import emit, emit_batches
from replay import manifest as manifests
from replay import views
from replay.read import iter_events, require_runs
from replay.store import first, open_sql, resolve, waiting_runs
from replay.summary import summaries, summary
from schemas.display import one_line
from schemas.errors import AmbError, UsageError
from schemas.events import AnyPayload

RUN_COLUMNS = "run_id task tier agent model status duration_s n_model_calls n_tool_calls n_events".split()


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
    lines += [f"limited   {lim['limitation']}: {lim['text']}" for lim in s.get("limitations", [])]
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
            raise AmbError(f"query refused or failed: {str(e).splitlines()[0]}") from e


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


commands = [runs, show, sql, manifest, schema]
