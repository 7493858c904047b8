"""Agent commands: ``amb baseline serve`` (the offline scripted model server) and ``amb sweep``."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import click

from amb.common import store_option
from amb.output import table
from schemas.errors import UsageError


@click.group()
def baseline() -> None:
    """The offline baseline: an OpenAI-compatible server whose model is a scripted policy."""


@baseline.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (keep it on loopback).")
@click.option(
    "--port", default=0, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one)."
)
@click.option(
    "--flaw",
    default=None,
    help="Default flaw for model 'baseline': no-pilot, wrong-filename, "
    "crash-mid-batch, hand-written or private-path (model 'baseline+<flaw>' picks one per request).",
)
@click.option(
    "--url-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the server's URL (scheme://host:port) to this file once it listens.",
)
def serve(host: str, port: int, flaw: str | None, url_file: str | None) -> None:
    """Serve the baseline policy on /v1/chat/completions until interrupted."""
    from agents.baseline.policy import PolicyError
    from agents.baseline.server import BaselineServer, model_names

    try:
        server = BaselineServer(host, port, flaw)
    except PolicyError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.start()
    if url_file:
        tmp = Path(url_file + ".tmp")
        tmp.write_text(server.url + "\n")
        tmp.replace(url_file)
    click.echo(
        f"baseline: serving on {server.url}/v1 (models: {', '.join(model_names())}"
        + (f"; default flaw {flaw}" if flaw else "")
        + "); Ctrl-C stops",
        err=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()


@click.command()
@store_option
@click.argument("sweepfile", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--work",
    "work_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where twins, workspaces and logs go (default: the sweep file's `work`, else ./sweep-<name>).",
)
@click.option("--no-score", is_flag=True, help="Record only; skip `amb score` and `amb report` at the end.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Report page to write at the end (default: <work>/report.html).",
)
@click.option("--dry-run", is_flag=True, help="List the cells and their state in the store; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the cell table as JSON.")
def sweep(
    store: str,
    sweepfile: str,
    work_dir: str | None,
    no_score: bool,
    html_file: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Run SWEEPFILE: agents x tasks x tiers x repeats as independent recorded runs (resumable)."""
    import json

    from agents.sweep import SweepOutcome, load_sweep, plan_cells, run_sweep
    from recorder.keyguard import guard_this_process

    # The sweep hands the real keys to each amb-record: its own environment and memory hold them
    # too, and its local agents run as the same user (recorder/keyguard.py).
    guard_this_process()
    spec = load_sweep(Path(sweepfile), work=Path(work_dir) if work_dir else None)
    if dry_run:
        cells = plan_cells(spec, Path(store).resolve())
        if as_json:
            click.echo(json.dumps(SweepOutcome(cells, False, {}).as_dict(), indent=2))
        else:
            click.echo(
                table(
                    ["run_id", "agent", "model", "task", "tier", "repeat", "state", "attempts"],
                    [
                        [
                            c.attempt_id(1),
                            c.agent.name,
                            c.agent.model,
                            c.task.id,
                            c.tier,
                            c.repeat,
                            c.state,
                            len(c.attempts),
                        ]
                        for c in cells
                    ],
                )
            )
        return
    outcome = run_sweep(spec, Path(store), render_table=table)
    if as_json:
        click.echo(json.dumps(outcome.as_dict(), indent=2))
    if outcome.interrupted:
        click.echo(
            f"amb sweep: interrupted; {outcome.summary()}. Run the same command again to resume.", err=True
        )
        sys.exit(130)
    click.echo(f"amb sweep: {outcome.summary()}", err=True)
    if not no_score and outcome.final_runs:
        _score_and_report(click.get_current_context(), store, spec, outcome, html_file, quiet=as_json)
    if outcome.gave_up:
        sys.exit(1)


def _score_and_report(
    ctx: click.Context, store: str, spec, outcome, html_file: str | None, quiet: bool
) -> None:
    """Ingest whatever an interrupted run left in its spool, score the sweep's runs, write the report."""
    from amb.score_cmds import report, score
    from replay.ingest import ingest

    ingest(store)
    html = html_file or str(spec.work / "report.html")
    for references, runs in outcome.runs_by_references().items():
        args = dict(
            store=store,
            runs=tuple(runs),
            all_runs=False,
            profile=spec.profile,
            judge=spec.judge,
            references=str(references),
            jobs=spec.score_jobs,
            compare_ref=None,
            repeat=spec.judge_repeat,
            as_json=False,
        )
        if quiet:
            with open(os.devnull, "w") as devnull, _redirect(devnull):
                ctx.invoke(score, **args)
        else:
            ctx.invoke(score, **args)
    if quiet:
        with open(os.devnull, "w") as devnull, _redirect(devnull):
            ctx.invoke(
                report, store=store, profile=spec.profile, judge_label=None, html_file=html, as_json=False
            )
    else:
        ctx.invoke(report, store=store, profile=spec.profile, judge_label=None, html_file=html, as_json=False)
    click.echo(f"amb sweep: report written to {html}", err=True)


class _redirect:
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        self.saved = sys.stdout
        sys.stdout = self.stream

    def __exit__(self, *exc):
        sys.stdout = self.saved


commands = [baseline, sweep]
