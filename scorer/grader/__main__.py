"""``python -m scorer.grader``: the grader image's entry point (it has no ``amb`` package), the same
command as ``amb grade`` with the same one-line errors."""

from __future__ import annotations

import sys

import click

from schemas.display import for_message
from schemas.errors import AmbError
from scorer.grader.cli import grade


def main() -> None:
    try:
        grade.main(prog_name="python -m scorer.grader", standalone_mode=False)
    except AmbError as e:
        click.echo(f"amb: error: {for_message(str(e), 8192)}", err=True)  # (it may quote the agent's text)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        sys.exit(1)


if __name__ == "__main__":
    main()
