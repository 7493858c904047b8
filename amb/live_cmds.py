"""`amb watch` (runs as they record, from their spools), `amb checkout` and `amb files` (the
workspace at any moment of a run, from its file events and blobs)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from amb.common import output_path, store_option, stored_only
from amb.output import emit
from replay.live import RunFollower, SpoolTail
from replay.read import check_run_id
from replay.store import DB_NAME, Store, resolve
from replay.workspace import FILE_KINDS, MOMENT_KINDS, Workspace, at_moment, checkout, diff, run_events
from schemas.blobstore import BlobStore
from schemas.codec import ID_RE, Event
from schemas.display import one_line
from schemas.errors import AmbError, NotFound, UsageError, quoted
from schemas.prices import load_table
from sweeps.shard import Layout


def _sweep_runs(sweep: Path) -> dict[str, Path]:
    """The attempts of a sweep's work directory (its shard root), each with the spool directory it
    records into: ``shards/<id>`` once complete, else the newest ``attempts/<id>/<token>``, else (a
    spec written, nothing started yet) where it will be. Names that are not run ids are ignored: the
    directory is shared with whatever the engine's nodes write there."""
    found: dict[str, Path] = {}
    layout = Layout(sweep)

    def ids(folder: Path, suffix: str = "") -> list[str]:
        try:
            rids = [n.removesuffix(suffix) for n in os.listdir(folder) if n.endswith(suffix)]
        except FileNotFoundError:
            return []
        return [rid for rid in rids if ID_RE.match(rid)]

    for rid in ids(layout.specs, ".json"):
        found[rid] = layout.attempts / rid / "(not started)" / "spool" / rid
    for rid in ids(layout.attempts):
        try:
            tokens = [t for t in os.scandir(layout.attempts / rid) if t.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
        if tokens:
            newest = max(tokens, key=lambda t: t.stat(follow_symlinks=False).st_mtime_ns)
            found[rid] = Path(newest.path) / "spool" / rid
    for rid in ids(layout.shards):
        found[rid] = layout.shard(rid) / "spool" / rid
    return found


def _running_runs(spool: Path, followers: dict[str, RunFollower], finished: set[str]) -> set[str]:
    """Runs with a spool and no run.finished yet (finished ones already followed stay shown).
    Runs found finished are remembered in ``finished``: a store of many old runs is read once."""
    try:
        names = set(os.listdir(spool)) - finished
    except FileNotFoundError:
        return set()
    out = set()
    for name in names:
        if name in followers:
            out.add(name)
            continue
        tail = SpoolTail(spool / name / "recorder.spool")
        try:
            if any(e.kind == "run.finished" for e in tail.poll()):
                finished.add(name)
            else:
                out.add(name)
        except AmbError:
            out.add(name)  # shown with its error
    return out


def _safe(text: object) -> Any:
    """Agent-written text as a rich Text: never read as markup, control characters (a terminal's
    escape sequences) shown escaped (``schemas.display.one_line``)."""
    from rich.text import Text

    return Text(one_line(str(text)))


def _line(call: dict[str, Any] | None, what: str) -> str:
    if call is None:
        return "-"
    if what == "model":
        state = "ok" if call["ok"] else f"FAILED {call['error']}"
        tools = f" → {', '.join(call['tool_calls'])}" if call["tool_calls"] else ""
        return f"{call['model']} {state} in {call['input_tokens']}/out {call['output_tokens']}{tools}"
    result = call.get("result")
    status = "…" if result is None else ("error" if result["is_error"] else "done")
    return f"{call['name']}({call['arguments']}) {status}"


DETAILED = 8
"""Runs whose last model call, tool call and file get their own lines under the table."""


def _table(views: list[dict[str, Any]]) -> Any:
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"amb watch: {len(views)} run(s)", box=box.SIMPLE_HEAD)
    t.add_column("run", overflow="fold", min_width=12)
    for col, width in (("status", 9), ("step", 4), ("in/out", 6), ("cost $", 6), ("files w/d/r", 5)):
        t.add_column(col, min_width=width)
    for col in ("procs", "time", "left"):
        t.add_column(col)
    for v in views:
        cost = "unknown" if v["cost_usd"] is None else f"{v['cost_usd']:.4f}"
        cells = [
            v["run_id"],
            v["status"] + (f" ({v['error']})" if v["error"] else ""),
            v["step"],
            f"{v['tokens']['input']}/{v['tokens']['output']}",
            cost,
            f"{v['files_written']}/{v['files_deleted']}/{v['files_renamed']}",
            v["processes_exited"],
            "-" if v["elapsed_s"] is None else f"{v['elapsed_s']:.0f}s",
            "-" if v["remaining_s"] is None else f"{v['remaining_s']:.0f}s",
        ]
        t.add_row(*(_safe(c) for c in cells))
    lines: list[Any] = [t]
    recent = sorted(views, key=lambda v: v["last_event_ns"] or 0, reverse=True)[:DETAILED]
    for v in recent:
        f = v["last_file"]
        lines.append(Text(f"{v['run_id']}", style="bold"))
        lines.append(_safe(f"  model: {_line(v['last_model_call'], 'model')}"))
        lines.append(_safe(f"  tool:  {_line(v['last_tool_call'], 'tool')}"))
        lines.append(_safe(f"  file:  {f['op'] + ' ' + f['path'] if f else '-'}"))
    return Group(*lines)


@click.command("watch")
@click.argument("runs", nargs=-1)
@click.option(
    "--sweep", "sweep", type=click.Path(file_okay=False, path_type=Path), help="A sweep's work dir."
)
@click.option("--all-running", is_flag=True, help="Every run of the store still recording (and new ones).")
@click.option("--json", "as_json", is_flag=True, help="JSON lines: a run's state each time it changes.")
@click.option("--once", is_flag=True, help="Show the current state once and exit.")
@click.option("--interval", type=float, default=0.25, show_default=True, help="Seconds between reads.")
@click.option(
    "--wait-start",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SEC",
    help="Without --once: how long a RUN that has not started yet is waited for (then: not found).",
)
@click.option("--price-table", default=None, help="Price table (default: the default profile's).")
@store_option
def watch_cmd(
    runs: tuple[str, ...],
    sweep: Path | None,
    all_running: bool,
    as_json: bool,
    once: bool,
    interval: float,
    wait_start: float,
    price_table: str | None,
    store: str,
) -> None:
    """Watch runs as they record, read straight from their spools (no ingest, no lock; writes nothing).

    Exits when every watched run has finished (with --all-running or --sweep: on Ctrl-C)."""
    if sum(bool(x) for x in (runs, sweep, all_running)) != 1:
        raise UsageError("watch: give RUN ids, --sweep DIR or --all-running (one of them)")
    if not (math.isfinite(interval) and interval > 0):
        raise UsageError(f"--interval {interval}: must be a positive number of seconds")
    if sweep is not None and not sweep.is_dir():
        raise NotFound(f"--sweep {sweep}: no such directory")
    only_stored = _started(store, runs, 0.0 if once else wait_start, interval)
    spool = resolve(store) / "spool"
    from scorer.profile import load

    prices = load_table(price_table or load(None).profile.cost.price_table)
    followers: dict[str, RunFollower] = {}
    finished: set[str] = set()
    open_ended = bool(sweep or all_running)

    def targets() -> dict[str, Path]:
        if sweep is not None:
            return _sweep_runs(sweep)
        if all_running:
            return {r: spool / r for r in _running_runs(spool, followers, finished)}
        return {r: spool / r for r in runs}

    def tick() -> list[str]:
        changed = []
        for run_id, run_dir in sorted(targets().items()):
            # A sweep's attempt moves (attempts/ -> shards/) when complete: follow it where it is now.
            if run_id not in followers or followers[run_id].dir != run_dir:
                followers[run_id] = RunFollower(run_dir, prices, stored=run_id in only_stored)
                changed.append(run_id)
            if followers[run_id].poll() and run_id not in changed:
                changed.append(run_id)
        return changed

    def done() -> bool:
        return not open_ended and all(f.finished or f.state.error for f in followers.values())

    try:
        if as_json:
            while True:
                now = time.time_ns()
                for run_id in tick():
                    sys.stdout.write(json.dumps(followers[run_id].state.view(now)) + "\n")
                sys.stdout.flush()
                if once or done():
                    return
                time.sleep(interval)
        from rich.console import Console
        from rich.live import Live

        console = Console()
        if once:
            tick()
            console.print(_table([f.state.view() for _, f in sorted(followers.items())]))
            return
        with Live(console=console, auto_refresh=False) as live:
            while True:
                tick()
                live.update(_table([f.state.view() for _, f in sorted(followers.items())]), refresh=True)
                if done():
                    return
                time.sleep(interval)
    except KeyboardInterrupt:
        return
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head): nothing more to say
        return


def _run_events(store: str, run_id: str) -> tuple[list[Event], BlobStore, bool]:
    """The run's file and moment events: from the store when ingested, else from its spools
    (then True: a ``SOURCE:SEQ`` of another kind cannot be looked up)."""
    check_run_id(run_id)
    root = resolve(store)
    events: list[Event] = []
    if (root / DB_NAME).exists():
        with Store.open(root, read_only=True) as st:
            events = run_events(st.con, run_id)
    if events:
        return events, BlobStore(root / "blobs"), False
    spool_dir = root / "spool" / run_id
    if not spool_dir.is_dir():
        raise NotFound(f"no run {quoted(run_id)} in the store at {root} (see `amb runs`)")
    for path in sorted(spool_dir.glob("*.spool")):
        events += [e for e in SpoolTail(path).poll() if e.kind in FILE_KINDS + MOMENT_KINDS]
    return events, BlobStore(root / "blobs"), True


def _workspace(
    store: str, run_id: str, spec: str, events: list[Event], from_spools: bool = False
) -> Workspace:
    root = resolve(store)
    if from_spools or not (root / DB_NAME).exists() or not _names_other_event(spec, events):
        return at_moment(None, run_id, spec, events)
    with Store.open(root, read_only=True) as st:
        return at_moment(st.con, run_id, spec, events)


def _names_other_event(spec: str, events: list[Event]) -> bool:
    """Does ``spec`` name an event that is not among ``events`` (so the store must be asked)?"""
    source, _, seq = spec.strip().partition(":")
    if not (seq.isascii() and seq.isdigit()) or source in ("step", "time"):
        return False
    return not any(e.source == source and e.seq == int(seq) for e in events)


def _moment_spec(at: str | None, step: int | None, before_submit: bool, when: str | None) -> str:
    given = [
        at,
        None if step is None else f"step:{step}",
        "before-submit" if before_submit else None,
        None if when is None else f"time:{when}",
    ]
    moments = [m for m in given if m is not None]
    if len(moments) > 1:
        raise UsageError("checkout: give at most one of --at, --step, --before-submit, --time")
    return moments[0] if moments else "end"


@click.command("checkout")
@click.argument("run")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--at", "at", default=None, metavar="SOURCE:SEQ", help="Just after this event (or any MOMENT).")
@click.option("--step", type=int, default=None, help="When the N-th tool call result was sent to the model.")
@click.option("--before-submit", is_flag=True, help="When the submission was sealed.")
@click.option("--time", "when", default=None, metavar="ISO", help="At this time (UTC unless it says).")
@click.option("--json", "as_json", is_flag=True)
@store_option
def checkout_cmd(
    run: str,
    directory: Path,
    at: str | None,
    step: int | None,
    before_submit: bool,
    when: str | None,
    as_json: bool,
    store: str,
) -> None:
    """Write RUN's workspace as it was at a moment into DIRECTORY (new or empty), every byte verified."""
    output_path(directory, "DIRECTORY", folder=True)
    events, blobs, from_spools = _run_events(store, run)
    ws = _workspace(store, run, _moment_spec(at, step, before_submit, when), events, from_spools)
    report = checkout(ws, blobs, directory)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(
        f"{run} at {report['moment']}: {report['files']} file(s), {report['bytes']:,} bytes in {directory}"
    )
    for f in report["not_kept"]:
        click.echo(f"  not kept: {f['path']} ({f['size']} bytes, {f['sha256']}, {f['event']}): {f['note']}")
    for f in report["outside"]:
        click.echo(f"  outside the workspace, not written: {f['path']} ({f['event']})")
    for f in report["refused"]:
        click.echo(f"  refused: {f['path']!r} ({f['event']}): {f['reason']}")


@click.command("files")
@click.argument("run")
@click.option(
    "--at", "at", default="end", show_default=True, metavar="MOMENT", help="List the files at MOMENT."
)
@click.option("--diff", "between", nargs=2, default=None, metavar="A B", help="What changed from A to B.")
@click.option("--json", "as_json", is_flag=True)
@store_option
def files_cmd(run: str, at: str, between: tuple[str, str] | None, as_json: bool, store: str) -> None:
    """RUN's workspace files at a moment, or what changed between two moments.

    MOMENT: end, start, before-submit, step:N, time:ISO, or SOURCE:SEQ (an event)."""
    events, _, from_spools = _run_events(store, run)
    if between:
        a, b = (_workspace(store, run, m, events, from_spools) for m in between)
        rows = diff(a, b)
        cols = ["change", "path", "from", "size_a", "size_b", "sha256_a", "sha256_b", "event"]
        if as_json:
            click.echo(json.dumps({"a": a.moment.label, "b": b.moment.label, "changes": rows}, indent=2))
        else:
            emit(cols, [[r[c] for c in cols] for r in rows])
        return
    ws = _workspace(store, run, at, events, from_spools)
    rows = [f.row() for _, f in sorted(ws.files.items())]
    if as_json:
        outside = [f.row() for f in ws.outside.values()]
        shown = {"moment": ws.moment.label, "files": rows, "outside": outside, "refused": ws.refused}
        click.echo(json.dumps(shown, indent=2))
        return
    cols = ["path", "size", "sha256", "kept", "event", "note"]
    emit(cols, [[r[c] for c in cols] for r in rows])


commands = [watch_cmd, checkout_cmd, files_cmd]


def _started(store: str, runs: tuple[str, ...], wait_s: float, interval: float) -> set[str]:
    """``stored_only`` once every RUN has started: a live watch may begin before the run it watches
    (``amb watch ID`` beside ``amb-record --run-id ID``), so an unknown run is waited for up to
    ``wait_s`` seconds before it is not found."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return stored_only(store, runs)
        except NotFound:
            if time.monotonic() >= deadline:
                raise
            if not said:
                click.echo(f"amb watch: waiting up to {wait_s:g} s for {', '.join(runs)} to start", err=True)
                said = True
            time.sleep(min(interval, max(deadline - time.monotonic(), 0.0)))
