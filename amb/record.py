"""``amb-record``: run any agent with every model call and network request on the record.

Exits with the agent's exit code (124 when the time limit was hit). The outcome is printed on
stderr (stdout belongs to the agent, then the run id). Ingest into DuckDB happens here, at the
end, because ``recorder`` may not import ``replay``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from amb.common import escape_output, fail, store_option
from recorder.budget import DEFAULT_PRICE_TABLE, Budget, checked
from recorder.isolation import MODES as ISOLATION_MODES
from recorder.proxy.upstreams import DEFAULT_KINDS
from recorder.run import DEFAULT_GRACE_S, RunSpec, parse_allow_hosts, parse_labels, parse_upstreams, record
from replay.read import check_run_id
from replay.replayer.recorded import MODES as MATCH_MODES
from schemas.errors import AmbError, BadInput, UsageError, quoted
from schemas.events import BudgetLimits
from schemas.ostext import is_utf8


@dataclass(frozen=True)
class RecordArgs:
    """The command line of ``amb-record``, as click parsed it: one field per option's parameter."""

    store: str
    task: str | None
    tier: str | None
    data_dir: str | None
    backend: str
    time_limit: float | None
    grace: float
    run_id: str | None
    labels: tuple[str, ...]
    agent_name: str | None
    model: str | None
    upstreams: tuple[str, ...]
    allow_hosts: tuple[str, ...]
    gpus: str | None
    shim: bool
    isolation: str | None
    no_ingest: bool
    replay_run: str | None
    replay_match: str
    replay_timing: str
    max_tokens: int | None
    max_cost: float | None
    max_calls: int | None
    price_table: str
    command: tuple[str, ...]

    def budget(self) -> BudgetLimits:
        """--max-tokens / --max-cost / --max-calls as the recorder takes them (checked here)."""
        return checked(
            BudgetLimits(
                max_tokens=self.max_tokens,
                max_cost_usd=self.max_cost,
                max_calls=self.max_calls,
                price_table=self.price_table,
            )
        )


TEXT_OPTIONS = "task run_id labels agent_name model upstreams allow_hosts gpus replay_run".split()
"""The options recorded as text (``run.started``): each must be UTF-8. Paths and the command's argv
are recorded whatever their bytes."""


def _backend(name: str, gpus: str | None, shim: bool, isolation: str | None):
    if name == "local":
        from recorder.local_backend import LocalBackend

        return LocalBackend(shim=shim) if isolation is None else LocalBackend(shim=shim, isolation=isolation)
    try:
        from recorder.docker_backend import DockerBackend
    except ImportError as e:
        raise UsageError(f"--backend docker is not available: {e}") from None
    return DockerBackend(gpus=gpus) if gpus else DockerBackend()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@store_option
@click.option("--task", default=None, help="Task id (recorded in run.started).")
@click.option("--tier", type=click.Choice(["lite", "standard"]), default=None, help="Brief tier.")
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="The task's data root (only DIR/public reaches the agent).",
)
@click.option("--backend", type=click.Choice(["local", "docker"]), default="local", show_default=True)
@click.option(
    "--time-limit",
    type=float,
    default=None,
    metavar="SEC",
    help="SIGTERM the agent after SEC seconds, SIGKILL after the grace period; exit 124.",
)
@click.option(
    "--grace",
    type=float,
    default=DEFAULT_GRACE_S,
    show_default=True,
    metavar="SEC",
    help="Seconds between the time limit's SIGTERM and SIGKILL.",
)
@click.option("--run-id", default=None, help="Run id (default: UTC time + random suffix).")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="Free-form label (repeatable).")
@click.option(
    "--agent",
    "agent_name",
    default=None,
    metavar="NAME",
    help="The agent's name in `amb runs` and scores (default: the command's basename).",
)
@click.option(
    "--model", default=None, metavar="NAME", help="The model the agent is told to use (recorded at start)."
)
@click.option(
    "--upstream",
    "upstreams",
    multiple=True,
    metavar="KIND=URL|NAME=KIND:URL",
    help="Where a kind's calls go (openai, anthropic, gemini, azure; URL as given to its SDK, path "
    "included, e.g. openai=https://openrouter.ai/api/v1), or one more upstream of a kind whose key is "
    "NAME_API_KEY (e.g. glm=openai:https://open.bigmodel.cn/api/paas/v4). Default: the public APIs. "
    "See docs/recording.md.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="HOST:PORT",
    help="Let the proxy carry traffic to HOST:PORT even if it is on loopback or a private network "
    "(repeatable; refused by default).",
)
@click.option(
    "--gpus", default=None, metavar="SPEC", help="Docker backend: GPUs to pass through (e.g. all, 0,1)."
)
@click.option(
    "--shim",
    is_flag=True,
    help="Local backend: run the agent under the shim, recording every process and workspace file change.",
)
@click.option(
    "--isolation",
    type=click.Choice(ISOLATION_MODES),
    default=None,
    help="Local backend: run the agent in namespaces of its own, so it sees only its own processes "
    "(best-effort, the default: without them where this system cannot, saying so; required: refuse "
    "to run then).",
)
@click.option("--no-ingest", is_flag=True, help="Leave the spools for a later `amb ingest`.")
@click.option(
    "--replay",
    "replay_run",
    default=None,
    metavar="RUN",
    help="Answer the agent's model calls with RUN's recorded responses (from this store) instead of "
    "an upstream; the new run is labelled replay_of=RUN.",
)
@click.option(
    "--replay-match",
    type=click.Choice(MATCH_MODES),
    default="strict",
    show_default=True,
    help="How requests are matched to RUN's calls (see `amb replay serve --help`).",
)
@click.option(
    "--replay-timing",
    type=click.Choice(["original", "fast"]),
    default="fast",
    show_default=True,
    help="original: pace answers as recorded; fast: at once.",
)
@click.option(
    "--max-tokens",
    type=int,
    default=None,
    metavar="N",
    help="Budget: refuse model calls once the run's calls used N tokens (input and output).",
)
@click.option(
    "--max-cost",
    type=float,
    default=None,
    metavar="USD",
    help="Budget: refuse model calls once the run's calls cost USD under --price-table.",
)
@click.option(
    "--max-calls",
    type=int,
    default=None,
    metavar="N",
    help="Budget: at most N model calls reach the upstream.",
)
@click.option(
    "--price-table",
    default=DEFAULT_PRICE_TABLE,
    show_default=True,
    metavar="NAME|PATH",
    help="Prices for --max-cost (the default scoring profile's table).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record_cmd(**params: Any) -> None:
    """Record COMMAND (after --) as an agent run."""
    args = RecordArgs(**params)
    _check(args)
    if args.replay_run is None:
        _record(args)
        return
    if args.upstreams:
        raise UsageError("--replay answers every model call itself: it cannot be combined with --upstream")
    # The replay server lives here, in the CLI layer: recorder/ never imports replay/. It is
    # loaded (and the store's database let go) before the recording starts.
    from replay.replayer.server import ReplayServer, open_replayer, stderr_reporter

    replayer = open_replayer(
        Path(args.store),
        args.replay_run,
        args.replay_match,
        args.replay_timing,
        stderr_reporter("amb-record: replay: "),
    )
    with ReplayServer(replayer) as server:
        replaying = replace(
            args,
            labels=(*args.labels, f"replay_of={args.replay_run}", f"replay_match={args.replay_match}"),
            upstreams=tuple(f"{kind}={server.url}" for kind in DEFAULT_KINDS),
        )
        try:
            _record(replaying)
        finally:
            s = replayer.matcher.summary()
            served = f"{s['served']} of {s['recorded']} recorded calls served"
            missed = f"{len(s['misses'])} unmatched request(s)"
            unasked = f", {len(s['unserved'])} recorded call(s) never asked for" if s["unserved"] else ""
            click.echo(
                f"amb-record: replay of {args.replay_run} ({args.replay_match}): {served}, {missed}{unasked}",
                err=True,
            )


def _check(args: RecordArgs) -> None:
    """Every option, checked before anything is made or looked up (a spool, a replayed run)."""
    # Not UTF-8 would fail only when run.started is written, after the run's spool has claimed its id.
    flags = {p.name: p.opts[-1] for p in record_cmd.params if isinstance(p, click.Option)}
    for name in TEXT_OPTIONS:
        value = getattr(args, name)
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, str) and not is_utf8(v):
                raise BadInput(f"{flags[name]} {quoted(v)}: not UTF-8 text")
    if args.run_id is not None:
        check_run_id(args.run_id)
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise UsageError(f"--time-limit {args.time_limit}: must be a positive number of seconds")
    if not (math.isfinite(args.grace) and args.grace >= 0):
        raise UsageError(f"--grace {args.grace}: must be a number of seconds, 0 or more")
    if args.max_cost is not None and not math.isfinite(args.max_cost):
        raise UsageError(f"--max-cost {args.max_cost}: must be a finite amount of USD")
    if args.gpus and args.backend != "docker":
        raise UsageError("--gpus needs --backend docker")
    if args.shim and args.backend != "local":
        raise UsageError("--shim is for the local backend (the docker backend always runs the shim)")
    if args.isolation is not None and args.backend != "local":
        raise UsageError("--isolation is for the local backend (a container always isolates the agent)")
    budget = args.budget()
    if budget.max_cost_usd is not None:
        Budget(budget, run_model=args.model)  # the price table and the model's price
    _spec(args)  # labels, upstreams, allowed hosts


def _spec(args: RecordArgs) -> RunSpec:
    return RunSpec(
        argv=list(args.command),
        store=Path(args.store),
        run_id=args.run_id,
        task=args.task,
        tier=args.tier,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        time_limit_s=args.time_limit,
        grace_s=args.grace,
        labels=parse_labels(list(args.labels)),
        agent=args.agent_name,
        model=args.model,
        upstreams=parse_upstreams(list(args.upstreams)),
        allow_hosts=parse_allow_hosts(list(args.allow_hosts)),
        budget=args.budget(),
    )


def _record(args: RecordArgs) -> None:
    spec = _spec(args)
    outcome = record(spec, _backend(args.backend, args.gpus, args.shim, args.isolation))
    calls = outcome.counts.get("proxy:model_call.completed", 0)
    click.echo(
        f"amb-record: run {outcome.run_id}: {outcome.status}, exit code {outcome.exit_code}, "
        f"{calls} model call{'s' if calls != 1 else ''}" + (f" ({outcome.reason})" if outcome.reason else ""),
        err=True,
    )
    if not args.no_ingest:
        try:
            from replay.ingest import ingest

            ingest(args.store, run_ids=[outcome.run_id])
        except AmbError as e:
            click.echo(
                f"amb-record: warning: ingest failed ({e}); the spool is kept, run `amb ingest`", err=True
            )
    click.echo(outcome.run_id)  # the one line on stdout a script can capture, after the agent's output
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


def main(argv: list[str] | None = None) -> None:
    """The ``amb-record`` command (``argv``: its arguments, else the process's)."""
    escape_output()
    try:
        record_cmd.main(args=argv, prog_name="amb-record", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)
    except (click.ClickException, AmbError) as e:
        fail("amb-record", e)
