"""Options shared by every command."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

store_option = click.option(
    "--store",
    envvar="AMB_STORE",
    default="amb-store",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Store directory (DuckDB file, blobs, spools). Env: AMB_STORE.",
)


def progress(label: str) -> Callable[[int, int], None]:
    """A progress callback that draws a bar on stderr when it is a terminal."""
    state: dict = {}
    if not sys.stderr.isatty():
        return lambda done, total: None

    def update(done: int, total: int) -> None:
        bar = state.get("bar")
        if bar is None and total > 1:
            bar = state["bar"] = click.progressbar(length=total, label=label, file=sys.stderr)
            bar.__enter__()
        if bar is not None:
            bar.update(done - bar.pos)
            if done >= total:
                bar.__exit__(None, None, None)
                state["bar"] = None

    return update
