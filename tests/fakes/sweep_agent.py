"""The reference agent's command line as sweep files in the tests write it (one definition)."""

from __future__ import annotations

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
