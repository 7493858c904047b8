"""How long the soak tests run: a short form in the full test command, the long form in the soak bench.

A soak test repeats a scenario that must end the same way each time (an agent exhausting its
container, a sweep over every tier losing a node). The short form exercises every step of it once
more than needed to compare two endings; ``AMB_SOAK=1`` (``./just bench soak``) runs the long form
the scenario was specified with: more repeats, every tier of a sweep.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

SOAK = os.environ.get("AMB_SOAK") == "1"


def soak(short: T, long: T) -> T:
    """``long`` under ``AMB_SOAK=1``, ``short`` otherwise."""
    return long if SOAK else short


SWEEP_TIERS: tuple[str, ...] = soak(("standard",), ("lite", "standard"))
"""The tiers of the engine tests' sweeps: each task's standard brief (where the GPU cell is), or both."""
