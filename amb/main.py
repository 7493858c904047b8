"""The ``amb`` command: a click group that assembles one module per command group.

Command modules are imported only when their command runs (``COMMANDS`` maps each command name
to its module), so ``amb runs`` does not pay for importing the scorer, the grader's image
libraries or the openai client. Each module exposes ``commands``, a list of click commands.
"""

from __future__ import annotations

import errno
import importlib
import os
import re

import click

from amb.common import escape_output, fail
from schemas.errors import NO_ROOM, AmbError, BadInput, StoreError, quoted

MODULES: dict[str, tuple[str, ...]] = {
    "amb.store_cmds": ("ingest", "verify", "generate"),
    "amb.query_cmds": ("runs", "show", "sql", "manifest", "schema"),
    "amb.task_cmds": ("task",),
    "amb.grade_cmd": ("grade",),
    "amb.score_cmds": ("score", "report", "audit"),
    "amb.judge_cmds": ("judge",),
    "amb.scan_cmds": ("scan", "labels"),
    "amb.images": ("images",),
    "amb.sweep_cmds": ("sweep",),
    "amb.demo": ("demo",),
    "amb.doctor": ("doctor",),
    "amb.serve_cmds": ("serve", "replay", "baseline"),
    "amb.interop_cmds": ("import", "export"),
    "amb.live_cmds": ("watch", "checkout", "files"),
    "amb.storage_cmds": ("store", "blobs", "gc"),
}
COMMANDS = {name: module for module, names in MODULES.items() for name in names}
"""Command name -> the module that defines it."""


class AmbGroup(click.Group):
    """Loads commands lazily; turns every AmbError into one line on stderr and its exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module_name = COMMANDS.get(name)
        if module_name is None:
            return None
        for command in importlib.import_module(module_name).commands:
            if command.name == name:
                return command
        raise RuntimeError(f"{module_name} does not define the command {name!r}")

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as e:  # the group's own options
            fail("amb", e)

    def invoke(self, ctx: click.Context):
        escape_output()
        try:
            return super().invoke(ctx)
        except (AmbError, click.ClickException) as e:  # (ClickException: a command's arguments, as parsed)
            fail("amb", e)
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:
                # Only a name the user gave can be too long for the file system: said once, here,
                # rather than before every use of a path.
                fail("amb", BadInput(f"{quoted(e.filename)}: {e.strerror}"))
            if (no_room := full_disk(e)) is None:
                raise
            fail("amb", no_room)
        except Exception as e:
            # A damaged database found mid-query (a block whose checksum fails) or a disk that filled
            # up says what to do; any other exception is a bug, and surfaces as one.
            from replay.store import damage

            if (found := damage(e) or full_disk(e)) is None:
                raise
            fail("amb", found)


def full_disk(e: Exception) -> AmbError | None:
    """The one line for a write that found no room (else None), from any command: the file it
    could not write and what to do. DuckDB reports it as its own IO error carrying the system's
    text; its transactions leave the store as it was, so the command can simply run again."""
    if isinstance(e, OSError):
        if e.errno not in NO_ROOM:
            return None
        name, reason = e.filename, e.strerror
    else:
        text = str(e)
        reason = next((os.strerror(n) for n in NO_ROOM if os.strerror(n) in text), None)
        if reason is None:
            return None
        import duckdb  # (here: only an error whose text says the disk is full needs it)

        if not isinstance(e, duckdb.Error):
            return None
        # The file's name, quoted plainly or (inside an async write's JSON detail) with escaped quotes.
        found = re.search(r'Could not write file \\?"(.*?)\\?"', text)
        name = found.group(1) if found else None
    what = f"cannot write {quoted(name)}" if name else "cannot write"
    return StoreError(f"{what}: {reason}; free some space and run the command again")


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from amb.about import version_text

    click.echo(version_text())
    ctx.exit()


@click.group(cls=AmbGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version, the event versions read and written, the store migration level.",
)
def cli() -> None:
    """AMB recorder: record agent runs as hash-chained events, and score them offline."""
