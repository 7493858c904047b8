"""What every command shares: the --store option, progress bars, the one-line failure, checks of
the runs and paths a command is given."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from schemas.display import for_message
from schemas.errors import AmbError, BadInput, NotFound, quoted

store_option = click.option(
    "--store",
    envvar="AMB_STORE",
    default="amb-store",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Store directory (DuckDB file, blobs, spools). Env: AMB_STORE.",
)


def int_option(name: str, default: int, low: int, high: int | None, help_text: str) -> Any:
    """An option taking a whole number from ``low`` to ``high`` (None: no limit), its default shown."""
    return click.option(
        name, default=default, show_default=True, type=click.IntRange(low, high), help=help_text
    )


def escape_output() -> None:
    """Print what is not UTF-8 (a path's bytes, held as surrogates) as ``\\udcXX``, not fail mid-output."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def fail(prog: str, e: AmbError | click.ClickException) -> NoReturn:
    """The CLI contract for a failure: one line on stderr, ``<prog>: error: ...``, and the error's exit
    code (1 failed, 2 bad input, 3 not found; click's own usage errors are bad input, and its
    several lines of usage become a pointer to ``--help``)."""
    if isinstance(e, click.ClickException):
        text = e.format_message()
        ctx = getattr(e, "ctx", None)
        if isinstance(e, click.UsageError) and ctx is not None:
            text += f" (see `{ctx.command_path} --help`)"
    else:
        text = str(e)
    say_error(text, prog)
    sys.exit(e.exit_code)


def say_error(text: str, prog: str = "amb") -> None:
    """``<prog>: error: <text>`` on stderr, one line whatever the text quotes (a file name, an
    agent's text): its white space folded, and nothing left that a terminal would obey."""
    click.echo(f"{prog}: error: {for_message(' '.join(text.split()), 8192)}", err=True)


def exit_on(problems: list[str], code: int = 1) -> None:
    """Each problem as an error line on stderr; then exit ``code`` if there was any."""
    for problem in problems:
        say_error(problem)
    if problems:
        sys.exit(code)


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
    from replay.read import check_run_id, require_runs  # (the store's libraries only when needed)
    from replay.store import DB_NAME, Store, resolve

    root = resolve(store)
    absent = [r for r in dict.fromkeys(runs) if not (root / "spool" / check_run_id(r)).is_dir()]
    if absent and not (root / DB_NAME).exists():
        raise NotFound(f"no run {quoted(absent[0])} at {root}: no spools of it and no store (see `amb runs`)")
    if absent:
        with Store.open(root, read_only=True) as st:
            require_runs(st.con, absent, root)
    return set(absent)


def nearest_existing(path: Path) -> Path:
    """``path`` or the nearest of its parents that exists (the root at the least)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def output_path(path: str | os.PathLike[str], what: str, *, folder: bool = False) -> Path:
    """Where a command will write ``what`` (an option's name), checked before it does any work, so a
    bad path is one line and not a traceback after the work is done. A file's folder must exist; a
    folder may be new (its parents are made) but what exists of its path must be folders. Neither
    may stand where the other is needed, and the nearest existing folder must take a new file."""
    p = Path(path)
    shown = f"{what} {quoted(str(p))}"
    try:
        if folder:
            if p.exists() and not p.is_dir():
                raise BadInput(f"{shown}: exists and is not a folder")
            probe = nearest_existing(p)
            if not probe.is_dir():
                raise BadInput(f"{shown}: {quoted(str(probe))} is not a folder")
        else:
            if p.is_dir():
                raise BadInput(f"{shown}: is a folder; give a file name")
            probe = p.parent
            if not probe.is_dir():
                if probe.exists():
                    raise BadInput(f"{shown}: {quoted(str(probe))} is not a folder")
                raise NotFound(f"{shown}: there is no folder {quoted(str(probe))} to write it in")
        # A file made and removed: permission bits do not say it (root passes them all, /proc
        # refuses root too).
        try:
            fd, name = tempfile.mkstemp(prefix=".amb-probe-", dir=probe)
        except OSError as e:
            raise BadInput(f"{shown}: cannot write in {quoted(str(probe))}: {e.strerror or e}") from None
        os.close(fd)
        os.unlink(name)
    except OSError as e:  # a name too long for the file system, a loop of links, ...
        raise BadInput(f"{shown}: {e.strerror or e}") from None
    except ValueError as e:  # a NUL byte
        raise BadInput(f"{shown}: {e}") from None
    return p
