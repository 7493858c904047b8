"""``amb-record``: run any agent with every model call and network request on the record.

    amb-record [--store DIR] [--task ID --tier lite|standard --data DIR] [--backend local|docker]
               [--time-limit SEC] [--run-id ID] [--label K=V]...
               [--upstream KIND=URL | NAME=KIND:URL]... -- CMD ARGS...

Exits with the agent's exit code (124 when the time limit was hit). The run id and outcome are
printed on stderr (stdout belongs to the agent). Ingest into DuckDB happens here, at the end,
because ``recorder`` may not import ``replay``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from recorder.run import DEFAULT_GRACE_S, RunSpec, parse_labels, parse_upstreams, record
from schemas.errors import AmbError, UsageError


def _backend(name: str, gpus: str | None, shim: bool = False):
    if name == "local":
        if gpus:
            raise UsageError("--gpus needs --backend docker")
        from recorder.local_backend import LocalBackend

        return LocalBackend(shim=shim)
    if shim:
        raise UsageError("--shim is for the local backend (the docker backend always runs the shim)")
    try:
        from recorder.docker_backend import DockerBackend
    except ImportError as e:
        raise UsageError(f"--backend docker is not available: {e}") from None
    return DockerBackend(gpus=gpus) if gpus else DockerBackend()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--store",
    envvar="AMB_STORE",
    default="amb-store",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Store directory. Env: AMB_STORE.",
)
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
    "--gpus", default=None, metavar="SPEC", help="Docker backend: GPUs to pass through (e.g. all, 0,1)."
)
@click.option(
    "--shim",
    is_flag=True,
    help="Local backend: run the agent under the shim, recording every process and workspace file change.",
)
@click.option("--no-ingest", is_flag=True, help="Leave the spools for a later `amb ingest`.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record_cmd(
    store,
    task,
    tier,
    data_dir,
    backend,
    time_limit,
    grace,
    run_id,
    labels,
    upstreams,
    gpus,
    shim,
    no_ingest,
    command,
):
    """Record COMMAND (after --) as an agent run."""
    if time_limit is not None and time_limit <= 0:
        raise UsageError("--time-limit must be a positive number of seconds")
    spec = RunSpec(
        argv=list(command),
        store=Path(store),
        run_id=run_id,
        task=task,
        tier=tier,
        data_dir=Path(data_dir) if data_dir else None,
        time_limit_s=time_limit,
        grace_s=grace,
        labels=parse_labels(list(labels)),
        upstreams=parse_upstreams(list(upstreams)),
    )
    outcome = record(spec, _backend(backend, gpus, shim))
    calls = outcome.counts.get("proxy:model_call.completed", 0)
    click.echo(
        f"amb-record: run {outcome.run_id}: {outcome.status}, exit code {outcome.exit_code}, "
        f"{calls} model call{'s' if calls != 1 else ''}" + (f" ({outcome.reason})" if outcome.reason else ""),
        err=True,
    )
    if not no_ingest:
        try:
            from replay.ingest import ingest

            ingest(store, run_ids=[outcome.run_id])
        except AmbError as e:
            click.echo(
                f"amb-record: warning: ingest failed ({e}); the spool is kept, run `amb ingest`", err=True
            )
    click.echo(outcome.run_id)  # the one line on stdout a script can capture, after the agent's output
    sys.exit(outcome.exit_code)


def main() -> None:
    try:
        record_cmd.main(standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(2)
    except AmbError as e:
        click.echo(f"amb-record: error: {e}", err=True)
        sys.exit(e.exit_code)
