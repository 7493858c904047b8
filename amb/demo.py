"""``amb demo``: the main job, from an installed amb (``./just demo`` runs it in a checkout).

It records the offline baseline agent (and the same baseline with an injected flaw) on one
synthetic task per track, scores the runs, writes the HTML report, then lists, verifies and queries
the runs, all under ``--out``. No API key and no download: the "model" is a scripted policy served
on loopback (amb baseline).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import time
from importlib import resources
from pathlib import Path

import click

from schemas.errors import AmbError, UsageError

MARKER = ".amb-demo"
"""Written into a store the demo made, so that it never empties a store it did not make."""

SQL = (
    "SELECT run_id, count(*) AS calls, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out "
    "FROM model_calls GROUP BY ALL ORDER BY run_id"
)


def _say(message: str) -> None:
    click.echo(f"demo: {message}", err=True)


def sweep_text() -> str:
    """The packaged demo sweep (amb/demo-sweep.toml)."""
    path = resources.files("amb").joinpath("demo-sweep.toml")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AmbError(
            f"this installation of amb has no amb/demo-sweep.toml (looked for {path}); reinstall amb-recorder"
        ) from None


def fresh_store(store: Path, explicit: bool) -> None:
    """Empty the demo's store, refusing a store someone else made (say, AMB_STORE left exported)."""
    if store.exists() and not store.is_dir():
        raise UsageError(f"--store {store} exists and is not a directory")
    if store.is_dir() and any(store.iterdir()) and explicit and not (store / MARKER).is_file():
        raise UsageError(
            f"--store {store} holds files the demo did not make, and the demo empties its store first; "
            "give another --store (or unset AMB_STORE)"
        )
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    (store / MARKER).write_text("made by amb demo; emptied by the next amb demo\n")


def _engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:
        return False


def build_agent_image() -> str:
    """The current agent image's tag: found by content tag, or built (the first run only).

    The base is the one ``amb images build`` would use, or, where no registry answers, one made from
    a Debian root filesystem: directly when that base is here and the public one is not."""
    from amb.images import DEFAULT_BASE, ImageError, docker_client, ensure_images, rootfs_tag

    forced = os.environ.get("AMB_BASE_FROM_ROOTFS", "") not in ("", "0") or os.environ.get("AMB_BASE_IMAGE")
    if not forced:
        client = docker_client()
        names = {t for image in client.images.list() for t in image.tags}
        if DEFAULT_BASE not in names and rootfs_tag() in names:
            return ensure_images(("agent",), from_rootfs=True, log=_say)["agent"].tag
    try:
        return ensure_images(("agent",), log=_say)["agent"].tag
    except ImageError as e:
        if forced or os.geteuid() != 0 or shutil.which("debootstrap") is None:
            raise
        _say(f"{e}")
        _say("no registry reachable: building the base from a Debian root filesystem instead")
        return ensure_images(("agent",), from_rootfs=True, log=_say)["agent"].tag


def choose_backend(asked: str) -> tuple[str, str]:
    """(backend, why). ``auto``: docker when an engine answers and the agent image can be built."""
    from amb.images import ImageError

    if asked == "local":
        return "local", "--backend local"
    if not _engine_answers():
        if asked == "docker":
            raise AmbError("--backend docker: no Docker engine answers (start one, or set DOCKER_HOST)")
        return "local", "no Docker engine answers"
    try:
        tag = build_agent_image()
    except ImageError as e:
        if asked == "docker":
            raise AmbError(f"--backend docker: the agent image could not be built: {e}") from None
        _say(f"{e}")
        return "local", "a Docker engine answers, but the agent image could not be built (see above)"
    # The exact image just found or built, not whatever amb-agent:latest points at by the time a
    # run starts (another amb on this engine may re-point it).
    os.environ["AMB_AGENT_IMAGE"] = tag
    return "docker", f"a Docker engine answers (agent image {tag})"


@click.command("demo")
@click.option(
    "--out",
    "out_dir",
    default="out",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for the report, the store, the sweep file and the runs' work files.",
)
@click.option(
    "--store",
    envvar="AMB_STORE",
    default=None,
    type=click.Path(file_okay=False),
    help="Store directory (default: OUT/demo-store). Emptied first, so only a store the demo made. "
    "Env: AMB_STORE.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "docker", "local"]),
    default="auto",
    show_default=True,
    help="auto: docker when an engine answers and the agent image can be built, else local.",
)
@click.option(
    "--tier",
    "tiers",
    type=click.Choice(["lite", "standard"]),
    multiple=True,
    help="Record only this tier's briefs (repeatable; default: both). One tier is half the runs, "
    "still one task per track and both agents.",
)
def demo(out_dir: str, store: str | None, backend: str, tiers: tuple[str, ...]) -> None:
    """Record a sample agent on one task per track, score the runs, show and verify them."""
    from amb.query_cmds import runs, sql
    from amb.score_cmds import report, score
    from amb.store_cmds import verify
    from amb.sweep_cmds import sweep
    from sweeps.plan import load_sweep

    start = time.monotonic()
    out = Path(out_dir)
    store_path = Path(store) if store else out / "demo-store"
    fresh_store(store_path, explicit=store is not None)
    shutil.rmtree(out / "demo", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)

    chosen, why = choose_backend(backend)
    if chosen == "docker":
        _say("a Docker engine answers: each run is recorded in a container (docker backend, with the shim)")
    else:
        _say(f"{why}: runs are recorded as local processes (local backend)")
    sweep_file = out / "demo-sweep.toml"
    text = re.sub(r"(?m)^backend = .*$", f'backend = "{chosen}"', sweep_text())
    if tiers:
        chosen_tiers = ", ".join(f'"{t}"' for t in dict.fromkeys(tiers))
        text = re.sub(r"(?m)^tiers = .*$", f"tiers = [{chosen_tiers}]", text)
    sweep_file.write_text(text, encoding="utf-8")
    spec = load_sweep(sweep_file)
    n = len(spec.agents) * len(spec.tasks) * len(spec.tiers) * spec.repeats
    shape = f"{len(spec.agents)} agents x {len(spec.tasks)} tasks x {len(spec.tiers)} tiers"
    _say(f"recording {n} runs ({shape}), {spec.concurrency} at a time")
    html = out / "demo-report.html"
    store_arg = ["--store", str(store_path)]
    sweep.main([str(sweep_file), *store_arg, "--html", str(html)], "amb sweep", standalone_mode=False)

    click.echo()
    click.echo(
        "== the same runs rescored under the public code's rules (code-2026-04): "
        "which options changed which numbers"
    )
    rescore = [*store_arg, "--all", "--profile", "code-2026-04", "--references", str(out / "demo" / "data")]
    # The rescored rows are in the store; the diff below says what moved.
    with contextlib.redirect_stdout(io.StringIO()):
        score.main(rescore, "amb score", standalone_mode=False)
    diff = io.StringIO()
    with contextlib.redirect_stdout(diff):
        report.main(
            [*store_arg, "--diff-profiles", "paper-2026-06", "code-2026-04"],
            "amb report",
            standalone_mode=False,
        )
    lines = diff.getvalue().splitlines()
    click.echo("\n".join(lines[:60]))
    if len(lines) > 60:
        click.echo(f"... {len(lines) - 60} more lines: amb report --diff-profiles paper-2026-06 code-2026-04")

    click.echo()
    click.echo("== the runs, their hash chains, and one SQL question over them")
    runs.main(store_arg, "amb runs", standalone_mode=False)
    verify.main(store_arg, "amb verify", standalone_mode=False)
    sql.main([*store_arg, SQL], "amb sql", standalone_mode=False)
    click.echo()
    click.echo(
        f"demo: report written to {html}; store in {store_path}; {round(time.monotonic() - start)}s in all"
    )


commands = [demo]
