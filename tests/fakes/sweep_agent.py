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

CLEAN_AGENT = f"""
[[agents]]
name = "clean"
command = {json.dumps(AGENT)}
model = "baseline"
upstream = "openai={{baseline}}"
"""
"""The scripted baseline doing the work right."""

MISNAMED_AGENT = f"""
[[agents]]
name = "misnamed"
command = {json.dumps(AGENT)}
model = "baseline+wrong-filename"
upstream = "openai={{baseline}}"
"""
"""The same baseline writing its outputs under the wrong names: a flaw the scores must show."""

TWO_AGENTS = CLEAN_AGENT + MISNAMED_AGENT
"""The agents of the sweep tests: a flaw told apart from a clean run."""
