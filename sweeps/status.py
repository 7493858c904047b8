"""``amb sweep status DIR``: a sweep's state from its shared directory alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from schemas.codec import ID_RE
from schemas.durable import read_small
from schemas.errors import NotFound, UsageError
from sweeps.executor import attach
from sweeps.shard import Layout
from sweeps.spec import Agent, Cell
from sweeps.state import CellState, TaskRef, cell_dict, read_cell

PLAN_FILE = "sweep.json"


class Plan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``<root>/sweep.json``: the grid the driver planned, so that status sees cells not yet tried."""

    name: str
    max_attempts: int
    agents: dict[str, Agent]
    cells: list[Cell]
    executor: str


def read_plan(layout: Layout) -> Plan:
    path = layout.root / PLAN_FILE
    try:
        plan = msgspec.json.decode(read_small(path), type=Plan)
    except FileNotFoundError:
        raise NotFound(f"{layout.root}: not a sweep's directory (no {PLAN_FILE})") from None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise UsageError(f"{path}: unreadable: {e}") from None
    for c in plan.cells:
        # A cell's key names its files (shards/, cells/, attempts/): a plain name, or no cell.
        if not ID_RE.match(c.key):
            rule = "1-128 of letters, digits, '.', '_', ':', '-'"
            raise UsageError(f"{path}: cell {c.key!r} is not a run id ({rule})")
    return plan


def sweep_status(root: Path) -> dict[str, Any]:
    layout = Layout(root)
    plan = read_plan(layout)
    live: dict[str, str] = {}
    executor: dict[str, Any] = {"executor": plan.executor}
    try:
        ex = attach(layout)
    except UsageError as e:
        executor["error"] = str(e)
        ex = None
    if ex is not None:
        try:
            live = dict(ex.poll())
            executor = ex.describe()
        finally:
            ex.close()
    cells = []
    for c in plan.cells:
        agent = plan.agents.get(c.agent)
        if agent is None:
            raise UsageError(f"{layout.root / PLAN_FILE}: cell {c.key} names an unknown agent {c.agent!r}")
        state = CellState(c.sweep, agent, TaskRef(c.task), c.tier, c.repeat)
        read_cell(layout, state, plan.max_attempts)
        last = state.attempts[-1][0] if state.attempts else None
        if state.state == "pending" and live.get(last or "") in ("queued", "running"):
            state.state = "running"
        cells.append(state)
    lost = sum(
        1 for c in cells for _, o in c.attempts if o in ("lost", "unfinished") and c.state != "running"
    )
    states = Counter(c.state for c in cells)
    totals = {
        "cells": len(cells),
        **{s: states[s] for s in ("completed", "running", "pending", "gave_up")},
        "lost_attempts": lost,
        "duplicates": sum(len(c.duplicates) for c in cells),
        "cells_without_result": sum(1 for c in cells if c.state != "completed"),
    }
    return {
        "root": str(layout.root),
        "sweep": plan.name,
        "totals": totals,
        "executor": executor,
        "cells": [cell_dict(c) for c in cells],
    }
