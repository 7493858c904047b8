"""The reference agent as sweep files in the tests write it (one definition)."""

from __future__ import annotations

import json

AGENT = [
    "amb-agent",
    "--model",
    "{model}",
    "--task-dir",
    "{workspace}",
    "--data",
    "{data}",
    "--retry-delay",
    "0.5",
]


def agent_block(name: str, model: str) -> str:
    """One ``[[agents]]`` entry running the reference agent as ``model`` against the fake upstream."""
    return f"""
[[agents]]
name = "{name}"
command = {json.dumps(AGENT)}
model = "{model}"
upstream = "openai={{baseline}}"
"""


CLEAN_AGENT = agent_block("clean", "baseline")
"""The scripted baseline doing the work right."""

MISNAMED_AGENT = agent_block("misnamed", "baseline+wrong-filename")
"""The same baseline writing its outputs under the wrong names: a flaw the scores must show."""

TWO_AGENTS = CLEAN_AGENT + MISNAMED_AGENT
"""The agents of the sweep tests: a flaw told apart from a clean run."""
