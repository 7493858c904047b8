"""Live progress of a sweep: a cell table redrawn in place on a terminal (rich), one line per finished
attempt otherwise (logs, CI, pipes)."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from sweeps.state import CellState

STATES = ("completed", "running", "pending", "failed", "gave_up")


def cell_table(cells: list[CellState]) -> Table:
    """Agent x task x tier, with how many of its repeats are in each state."""
    groups: dict[tuple[str, str, str], dict[str, int]] = {}
    for c in cells:
        g = groups.setdefault((c.agent.name, c.task.id, c.tier), {})
        g[c.state] = g.get(c.state, 0) + 1
    table = Table(box=None, pad_edge=False)
    for name in ("agent", "task", "tier"):
        table.add_column(name)
    for name in STATES:
        table.add_column(name, justify="right")
    for (agent, task, tier), g in groups.items():
        table.add_row(agent, task, tier, *(str(g.get(s, 0)) for s in STATES))
    return table


class Progress:
    def __init__(self, out: TextIO):
        self.console = Console(file=out, highlight=False, soft_wrap=True)
        self.live: Live | None = None

    def line(self, text: str) -> None:
        self.console.print(f"amb sweep: {text}", markup=False)

    def start(self, cells: list[CellState]) -> None:
        if self.console.is_terminal:
            self.live = Live(cell_table(cells), console=self.console, refresh_per_second=4, transient=True)
            self.live.start()

    def update(self, cells: list[CellState]) -> None:
        if self.live is not None:
            self.live.update(cell_table(cells))

    def stop(self, cells: list[CellState]) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        self.console.print(cell_table(cells))
