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
