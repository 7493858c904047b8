"""``amb serve`` (the trajectory viewer), ``amb replay serve`` (recorded model calls served back) and
``amb baseline serve`` (the offline scripted model server)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from amb.common import int_option, store_option
from replay.replayer.recorded import MODES
from replay.store import resolve
from schemas.durable import write_durably
from schemas.errors import UsageError


@click.command()
@store_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@int_option("--port", 8765, 0, 65535, "Port (0: any free port).")
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow a non-loopback --host. The viewer has no login: anyone who reaches it reads every run.",
)
def serve(store: str, host: str, port: int, allow_remote: bool) -> None:
    """Serve the trajectory viewer and its JSON API (read-only on the store)."""
    from replay.web.server import Running
    from schemas.httpbase import is_loopback

    if not is_loopback(host):
        if not allow_remote:
            raise UsageError(
                f"--host {host} is not a loopback address: "
                "pass --allow-remote to serve the store beyond this machine"
            )
        click.echo(
            f"amb: warning: serving on {host}, beyond this machine, with no login: anyone who can reach "
            "it can read every run, prompt and file in the store",
            err=True,
        )
    try:
        running = Running(resolve(store), host, port)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound = running.port
    shown = f"[{host}]" if ":" in host else host
    click.echo(
        f"amb serve: the viewer of {resolve(store)} is at http://{shown}:{bound}/ (Ctrl-C stops it)", err=True
    )
    try:
        running.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()


@click.group()
def replay() -> None:
    """Serve a recorded run's model calls back (OpenAI and Anthropic wire formats)."""


@replay.command("serve")
@store_option
@click.argument("run_id")
@click.option(
    "--match",
    "mode",
    type=click.Choice(MODES),
    default="strict",
    show_default=True,
    help="strict: byte for byte, in order; canonical: equal JSON without volatile fields; "
    "sequence: in recorded order, whatever the body; lenient: canonical with run-specific text masked, "
    "else the closest.",
)
@click.option(
    "--timing",
    type=click.Choice(["original", "fast"]),
    default="fast",
    show_default=True,
    help="original: wait the recorded time to first byte and latency; fast: answer at once.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address (loopback only).")
@int_option("--port", 0, 0, 65535, "Port (0: any free port).")
def replay_serve(store: str, run_id: str, mode: str, timing: str, host: str, port: int) -> None:
    """Answer model API requests with RUN's recorded responses, until Ctrl-C."""
    import time

    from replay.replayer.server import ReplayServer, open_replayer, stderr_reporter
    from schemas.httpbase import is_loopback

    if not is_loopback(host):
        raise UsageError(f"--host {host}: the replay endpoint listens on loopback only")
    replayer = open_replayer(resolve(store), run_id, mode, timing, stderr_reporter("amb replay: "))
    try:
        server = ReplayServer(replayer, host, port)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    with server:
        n = len(replayer.matcher.calls)
        click.echo(
            f"amb replay: serving {n} recorded calls of {run_id} ({mode}, {timing} timing) at {server.url} "
            f"(OPENAI_BASE_URL={server.url}/v1, ANTHROPIC_BASE_URL={server.url}); Ctrl-C stops it",
            err=True,
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    s = replayer.matcher.summary()
    click.echo(
        f"amb replay: {s['served']} of {s['recorded']} recorded calls served, {len(s['misses'])} misses",
        err=True,
    )


@click.group()
def baseline() -> None:
    """The offline baseline: an OpenAI-compatible server whose model is a scripted policy."""


@baseline.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (keep it on loopback).")
@int_option("--port", 0, 0, 65535, "Port (0: any free one).")
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
def baseline_serve(host: str, port: int, flaw: str | None, url_file: str | None) -> None:
    """Serve the baseline policy on /v1/chat/completions until interrupted."""
    from agents.baseline.policy import PolicyError
    from agents.baseline.server import BaselineServer, model_names

    try:
        server = BaselineServer(host, port, flaw)
    except PolicyError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    # The handlers go in before the URL is announced: whoever reads the URL may stop the server
    # at once, and a SIGTERM before them would kill it without closing the socket or exiting 0.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    if url_file:
        write_durably(Path(url_file), (server.url + "\n").encode())
    click.echo(
        f"baseline: serving on {server.url}/v1 (models: {', '.join(model_names())}"
        + (f"; default flaw {flaw}" if flaw else "")
        + "); Ctrl-C stops",
        err=True,
    )
    stop.wait()
    server.stop()


commands = [serve, replay, baseline]
