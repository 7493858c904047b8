"""Agent commands: ``amb baseline serve`` (the offline scripted model server). Sweeps: ``amb.sweep_cmds``."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from schemas.durable import write_durably
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


commands = [baseline]
