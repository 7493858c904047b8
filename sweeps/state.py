"""A sweep's state, read from its shard root alone (any machine that sees the directory can read it):
per cell, every planned attempt and how it ended, the cell's result and its recorded duplicates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.task_spec import Tier
from sweeps.shard import Layout, claimed_or_first, read_info
from sweeps.spec import Agent, Cell, TaskRef, run_id

INTERRUPTED = ("killed", "unfinished", "lost")
"""Attempt outcomes that say the sweep, the engine or the machine stopped the run, not the agent."""


@dataclass
class CellState:
    sweep: str
    agent: Agent
    task: TaskRef
    tier: Tier
    repeat: int
    state: str = "pending"
    """pending, running, completed, failed (will retry), gave_up."""
    attempts: list[tuple[str, str]] = field(default_factory=list)
    """(run id, outcome) of every attempt so far, oldest first."""
    skipped: bool = False
    """Completed before this invocation (a resumed sweep leaves it alone)."""
    chosen: str | None = None
    """The run id ingest takes for this cell: its first completed attempt (``cells/<key>``)."""
    duplicates: list[str] = field(default_factory=list)
    """Complete executions that are not the cell's result (shard dirs, relative to the root)."""

    @property
    def cell(self) -> Cell:
        return Cell(self.sweep, self.agent.name, self.task.id, self.tier, self.repeat)

    def attempt_id(self, n: int) -> str:
        return run_id(self.cell, n)

    @property
    def final_run(self) -> str | None:
        if self.chosen:
            return self.chosen
        done = [r for r, o in self.attempts if o == "completed"]
        if done:
            return done[0]
        ended = [r for r, o in self.attempts if o not in ("unfinished", "lost")]
        return ended[-1] if ended else None

    def failures(self) -> int:
        return sum(1 for _, o in self.attempts if o not in INTERRUPTED and o != "completed")


NOT_RETRIED = ("budget_exceeded",)
"""Outcomes that end a cell at once: a retry of a run that spent its budget would spend it again
(the run is loaded and scored as the profile's ``[budget]`` rule says)."""


def shard_outcome(layout: Layout, rid: str) -> str | None:
    """How attempt ``rid`` ended: its shard's status; ``unfinished`` while it has only an attempt
    directory; None when there is neither."""
    shard = layout.shard(rid)
    if shard.is_dir() and not shard.is_symlink():
        try:
            return read_info(shard).status
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return "corrupt"
    try:
        if any((layout.attempts / rid).iterdir()):
            return "unfinished"
    except OSError:
        pass
    return None


def read_cell(layout: Layout, cell: CellState, max_attempts: int) -> None:
    """Fill ``cell`` from the shard root: attempts, chosen run, duplicates, state."""
    cell.attempts = []
    while True:
        rid = cell.attempt_id(len(cell.attempts) + 1)
        planned = layout.spec_file(rid).exists()
        outcome = shard_outcome(layout, rid)
        if outcome is None and not planned:
            break
        cell.attempts.append((rid, outcome or "lost"))
    first = next((r for r, o in cell.attempts if o == "completed"), None)
    cell.chosen = chosen = claimed_or_first(layout, cell.cell.key, first)
    cell.duplicates = [f"shards/{r}" for r, o in cell.attempts if o == "completed" and r != chosen]
    for rid, _ in cell.attempts:
        try:
            tokens = sorted(os.listdir(layout.duplicates / rid))
        except OSError:
            continue
        cell.duplicates += [f"duplicates/{rid}/{t}" for t in tokens]
    if chosen:
        cell.state = "completed"
    elif any(o in NOT_RETRIED for _, o in cell.attempts) or cell.failures() >= max_attempts:
        cell.state = "gave_up"
    else:
        cell.state = "pending"


def next_attempt(cell: CellState) -> int:
    return len(cell.attempts) + 1


def cell_dict(c: CellState) -> dict[str, Any]:
    """A cell as `amb sweep status --json` and the driver's summary show it."""
    return {
        "cell": c.cell.key,
        "agent": c.agent.name,
        "model": c.agent.model,
        "task": c.task.id,
        "tier": c.tier,
        "repeat": c.repeat,
        "state": c.state,
        "final_run": c.final_run,
        "chosen": c.chosen,
        "attempts": [{"run_id": r, "outcome": o} for r, o in c.attempts],
        "duplicates": list(c.duplicates),
    }
