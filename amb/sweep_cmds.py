"""``amb sweep``: run a sweep file on an executor, and its parts: ``exec`` (one run spec into one
shard), ``status`` and ``cancel`` (of a sweep's shared directory, from any machine that sees it).

``amb sweep SWEEPFILE [options]`` is short for ``amb sweep run SWEEPFILE [options]``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from pathlib import Path
from typing import cast, get_args

import click

from amb.common import store_option
from amb.output import table
from schemas.errors import UsageError
from sweeps.executor import ExecutorName


class SweepGroup(click.Group):
    """A group whose default subcommand is ``run``: ``amb sweep FILE`` = ``amb sweep run FILE``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=SweepGroup)
def sweep() -> None:
    """Sweeps: agents x tasks x tiers x repeats as independent recorded runs, on any executor.

    `amb sweep SWEEPFILE` runs a sweep (`amb sweep run --help`); docs/scale-out.md says how to run
    one on SLURM, Ray or Kubernetes.
    """


@sweep.command("run")
@store_option
@click.argument("sweepfile", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--work",
    "work_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="The sweep's shared directory: twins, run specs, shards, logs (default: the sweep file's "
    "`work`, else ./sweep-<name>).",
)
@click.option(
    "--executor",
    type=click.Choice(get_args(ExecutorName)),
    default=None,
    help="Where the runs execute (default: the sweep file's [executor] name, else local).",
)
@click.option(
    "--emit",
    "emit_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="With --executor k8s: write the run specs and Indexed Job manifests to DIR; run nothing.",
)
@click.option("--no-score", is_flag=True, help="Record only; skip `amb score` and `amb report` at the end.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Report page to write at the end (default: <work>/report.html).",
)
@click.option("--dry-run", is_flag=True, help="List the cells and their state; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the cell table as JSON.")
def run_cmd(
    store: str,
    sweepfile: str,
    work_dir: str | None,
    executor: str | None,
    emit_dir: str | None,
    no_score: bool,
    html_file: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Run SWEEPFILE: agents x tasks x tiers x repeats as independent recorded runs (resumable)."""
    from recorder.keyguard import guard_this_process
    from sweeps.driver import SweepOutcome, plan_cells, run_sweep
    from sweeps.plan import load_sweep
    from sweeps.shard import Layout

    # The sweep hands the real keys to each run: its own environment and memory hold them too, and
    # its local agents run as the same user (recorder/keyguard.py).
    guard_this_process()
    spec = load_sweep(Path(sweepfile), work=Path(work_dir) if work_dir else None)
    name = spec.executor.name if executor is None else cast(ExecutorName, executor)
    if emit_dir is not None or name == "k8s":
        if name != "k8s" or emit_dir is None:
            raise UsageError("--emit DIR goes with --executor k8s (which only writes manifests)")
        from sweeps.k8s import emit

        written = emit(spec, Path(emit_dir))
        click.echo(
            f"amb sweep: wrote {len(written)} manifest(s) to {emit_dir}: "
            + ", ".join(p.name for p in written)
        )
        return
    if dry_run:
        cells = plan_cells(spec, Layout(spec.work))
        if as_json:
            click.echo(json.dumps(SweepOutcome(cells, False, {}).as_dict(), indent=2))
        else:
            rows = [
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
            ]
            click.echo(
                table(["run_id", "agent", "model", "task", "tier", "repeat", "state", "attempts"], rows)
            )
        return
    _catch_up(store, spec.work)
    outcome = run_sweep(spec, Path(store), executor=name, ingest_into_store=_ingest_landed(spec.work))
    _catch_up(store, spec.work)
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


def _catch_up(store: str, root: Path) -> None:
    """Load every shard of the sweep the store does not hold yet (runs that landed while no sweep
    was watching: a killed sweep's stopped attempts, shards placed after it gave up waiting)."""
    from sweeps.collect import is_sweep_root, select
    from sweeps.shard import Layout

    if not is_sweep_root(root):
        return
    sel = select(Layout(root))
    _say_not_loaded(sel.refused)
    _load(store, sel.take)


def _ingest_landed(root: Path):
    """Bring each landed shard into the store, unless it is a duplicate of its cell's result."""
    from sweeps.collect import takes
    from sweeps.shard import Layout

    layout = Layout(root)

    def load(store: Path, shards: list[Path]) -> None:
        _load(store, [(d, d.name) for d in shards if takes(layout, d)])

    return load


def _load(store: str | Path, shards: list[tuple[Path, str]]) -> None:
    from replay.shards import load_shards

    if shards:
        _say_not_loaded(load_shards(store, shards).refused)


def _say_not_loaded(refused: list[tuple[str, str]]) -> None:
    for path, why in refused:
        click.echo(f"amb sweep: warning: shard {path} not loaded: {why}", err=True)


def _score_and_report(
    ctx: click.Context, store: str, spec, outcome, html_file: str | None, quiet: bool
) -> None:
    """Score the sweep's runs, write the report."""
    from amb.score_cmds import report, score

    html = html_file or str(spec.work / "report.html")
    # With --json, stdout holds the sweep's JSON alone: the tables of score and report go nowhere.
    silenced = (lambda: contextlib.redirect_stdout(io.StringIO())) if quiet else contextlib.nullcontext
    for references, runs in outcome.runs_by_references().items():
        with silenced():
            ctx.invoke(
                score,
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
    with silenced():
        ctx.invoke(report, store=store, profile=spec.profile, judge_label=None, html_file=html, as_json=False)
    click.echo(f"amb sweep: report written to {html}", err=True)


@sweep.command("exec")
@click.argument(
    "spec_file", metavar="SPEC.json", type=click.Path(dir_okay=False, exists=True), required=False
)
@click.option(
    "--serve",
    is_flag=True,
    help="Import once, then execute each spec named on stdin in a forked child (what the local "
    "executor runs; the protocol is in sweeps/forkserver.py).",
)
def exec_cmd(spec_file: str | None, serve: bool) -> None:
    """Execute one run spec: record one run into its shard under the spec's shard root.

    The one command every executor runs. Exit 0: the shard was placed (its shard.json holds the
    run's status); 3: the attempt already had its shard; 2: it could not run.
    """
    if serve:
        if spec_file is not None:
            raise UsageError("amb sweep exec --serve reads its specs on stdin: give no SPEC.json")
        from sweeps.forkserver import serve as serve_specs

        sys.exit(serve_specs())
    if spec_file is None:
        raise UsageError("amb sweep exec needs a SPEC.json (or --serve)")
    from sweeps.exec import execute

    sys.exit(execute(Path(spec_file)))


@sweep.command("status")
@click.argument("sweep_dir", metavar="DIR", type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status_cmd(sweep_dir: str, as_json: bool) -> None:
    """The state of the sweep whose shared directory is DIR: per cell, its attempts and result, the
    duplicates kept aside, the attempts lost, and what the executor says."""
    from sweeps.status import sweep_status

    st = sweep_status(Path(sweep_dir))
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    rows = []
    for c in st["cells"]:
        attempts = [
            f"{a['run_id'].rsplit('.', 1)[-1] if '.a' in a['run_id'] else 'a1'}:{a['outcome']}"
            for a in c["attempts"]
        ]
        rows.append([c["cell"], c["state"], c["chosen"] or "", " ".join(attempts), len(c["duplicates"])])
    click.echo(table(["cell", "state", "result", "attempts", "duplicates"], rows))
    t = st["totals"]
    click.echo(
        f"{t['completed']}/{t['cells']} cells completed, {t['running']} running, {t['pending']} pending, "
        f"{t['gave_up']} gave up; {t['lost_attempts']} attempt(s) lost, {t['duplicates']} duplicate(s), "
        f"{t['cells_without_result']} cell(s) without a result"
    )


@sweep.command("cancel")
@click.argument("sweep_dir", metavar="DIR", type=click.Path(file_okay=False, exists=True))
@click.option(
    "--wait", "wait_s", default=10.0, show_default=True, help="Seconds to wait for containers to stop."
)
def cancel_cmd(sweep_dir: str, wait_s: float) -> None:
    """Stop the sweep whose shared directory is DIR: its driver, its runs, and (on this machine's
    Docker engine) any container of it still running after --wait seconds."""
    from sweeps.cancel import cancel
    from sweeps.shard import Layout
    from sweeps.status import read_plan

    if not (math.isfinite(wait_s) and wait_s >= 0):
        raise UsageError(f"--wait {wait_s}: must be a number of seconds, 0 or more")
    layout = Layout(Path(sweep_dir))
    if not (layout.root / "executor").is_dir():
        # No executor state: a sweep's directory only if it holds a plan (else one clear line).
        read_plan(layout)
    for line in cancel(Path(sweep_dir), wait_s=wait_s):
        click.echo(f"amb sweep cancel: {line}", err=True)


commands = [sweep]
