"""The ``amb`` command: a click group that assembles one module per command group."""

from __future__ import annotations

import sys

import click

from schemas.errors import AmbError


class AmbGroup(click.Group):
    """Turns every AmbError into one line on stderr and its exit code, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except AmbError as e:
            click.echo(f"amb: error: {e}", err=True)
            sys.exit(e.exit_code)


@click.group(cls=AmbGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="amb-recorder")
def cli() -> None:
    """AMB recorder: record agent runs as hash-chained events, and score them offline."""


def _register() -> None:
    # Each command module exposes `commands`, a list of click commands or groups.
    from amb import store_cmds

    for module in (store_cmds,):
        for command in module.commands:
            cli.add_command(command)


_register()
