"""Options shared by every command."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from replay.read import check_run_id, require_runs
from replay.store import DB_NAME, Store, resolve
from schemas.errors import NotFound, quoted

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


def stored_only(store: str, runs: tuple[str, ...]) -> set[str]:
    """Of the RUNs named, those with no spool directory in the store, held by its database alone; a
    run neither place holds is ``NotFound`` (a string that cannot be a run id is ``BadInput``)."""
    root = resolve(store)
    absent = [r for r in dict.fromkeys(runs) if not (root / "spool" / check_run_id(r)).is_dir()]
    if absent and not (root / DB_NAME).exists():
        raise NotFound(f"no run {quoted(absent[0])} at {root}: no spools of it and no store (see `amb runs`)")
    if absent:
        with Store.open(root, read_only=True) as st:
            require_runs(st.con, absent, root)
    return set(absent)
