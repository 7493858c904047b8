"""The lazy command table matches what the command modules define."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from amb.main import COMMANDS

AMB = Path(__file__).parents[2] / "amb"


def test_every_command_module_is_registered():
    modules = {f"amb.{p.stem}" for p in AMB.glob("*.py") if re.search(r"^commands = ", p.read_text(), re.M)}
    assert modules == set(COMMANDS.values()), "add the module's commands to amb.main.COMMANDS"


def test_every_command_is_in_the_table():
    for module_name in set(COMMANDS.values()):
        for command in importlib.import_module(module_name).commands:
            assert COMMANDS.get(command.name) == module_name, (
                f"{command.name} ({module_name}) missing from COMMANDS"
            )


def test_a_usage_error_is_one_line(amb):
    # click's own errors (an unknown command, a value of the wrong type) keep the CLI contract too.
    for args, message in [
        (["nope"], "amb: error: No such command 'nope'. (see `amb --help`)"),
        (
            ["score", "--jobs", "abc", "--all"],
            "amb: error: Invalid value for '--jobs' / '-j': 'abc' is not a valid integer range. "
            "(see `amb score --help`)",
        ),
        (["sql"], "amb: error: Missing argument 'QUERY'. (see `amb sql --help`)"),
    ]:
        proc = amb(*args, check=False)
        assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == message + "\n", proc.stderr
