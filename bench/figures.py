"""The benches' figures as JSON, from which `./just docs` writes the README's performance table.

Each bench writes ``bench/results/<bench>.json`` (``--json FILE`` writes elsewhere): a list of rows,
one per measure, each with the figure, what it is set beside, the target, the machine's load while
the bench ran and the command that measured it. A run replaces the rows it measured (by ``id``)
and keeps the others, so ``--only`` runs update their own rows. Every cell is short enough for a
table (``MAX_CELL``); what a reader needs to interpret a figure is in the docs the row links.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import msgspec

RESULTS = Path(__file__).resolve().parent / "results"
MAX_CELL = 160
"""Characters of a table cell, at most: a row must be read, not scrolled."""
NONE = "—"


class Figure(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One measure of one bench: a row of the README's performance table."""

    id: str
    """Stable within its bench: the next run's row of the same id replaces this one."""
    measure: str
    """What is measured, on what data (may end with a link to the doc that explains it)."""
    figure: str
    compared_with: str = NONE
    """The baseline measured beside it (same process or same rounds), and the ratio."""
    target: str = NONE
    """The target, and whether the figure meets it."""
    load: str
    """The 1-minute load average while the bench ran (lowest–highest), and the machine's cores."""
    command: str

    def cells(self) -> list[str]:
        """The row's cells as the README's table shows them (a ``|`` escaped, the command as code)."""
        cells = [self.measure, self.figure, self.compared_with, self.target, self.load, f"`{self.command}`"]
        return [c.replace("|", "\\|") for c in cells]


def read(path: Path) -> list[Figure]:
    """The rows of one results file (an error naming the file if it is not a list of rows)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=list[Figure])
    except msgspec.ValidationError as e:
        raise SystemExit(f"{path}: not a list of bench figures: {e}") from None


def merge(old: list[Figure], new: list[Figure]) -> list[Figure]:
    """``old`` with each row of ``new`` in place of the row of the same id; new ids at the end."""
    fresh = {r.id: r for r in new}
    kept = [fresh.pop(r.id, r) for r in old]
    return kept + [r for r in new if r.id in fresh]


def write(path: Path, rows: list[Figure]) -> None:
    bad = [f"{r.id}: {c}" for r in rows for c in r.cells() if len(c) > MAX_CELL]
    if bad:
        raise SystemExit(f"bench: cells over {MAX_CELL} characters:\n  " + "\n  ".join(bad))
    old = read(path) if path.is_file() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    text = msgspec.json.format(msgspec.json.encode(merge(old, rows)), indent=2)
    path.write_bytes(text + b"\n")


def add_argument(parser: argparse.ArgumentParser, bench: str) -> None:
    """``--json FILE``: where the bench's rows go (default ``bench/results/<bench>.json``)."""
    parser.add_argument(
        "--json",
        metavar="FILE",
        type=Path,
        default=RESULTS / f"{bench}.json",
        help=f"write the figures here as JSON (default: bench/results/{bench}.json, the README's source)",
    )


PATHS = {"DIR", "CHECKOUT", "FILE"}
"""Metavars of options whose value is a path of this machine: a row shows the metavar instead."""


def command_line(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """The command as a reader would type it: ``./just bench NAME ARGS``, the value of each option
    whose metavar is a path (``PATHS``) shown as that metavar, ``--json`` left out."""
    placeholders = {
        opt: a.metavar for a in parser._actions for opt in a.option_strings if a.metavar in PATHS
    }  # argparse has no public accessor for its options
    shown: list[str] = []
    args = iter(argv)
    for arg in args:
        name, eq, _ = arg.partition("=")
        if name == "--json" or name in placeholders:
            if not eq:
                next(args, None)
            if name != "--json":
                shown += [name, str(placeholders[name])]
            continue
        shown.append(arg)
    return shlex.join(["./just", "bench", parser.prog.removesuffix(".py"), *shown])


class Figures:
    """Collects one bench run's rows; samples the load average every few seconds meanwhile.

    ``add`` takes a row's measure, figure, baseline and target; its load is the lowest and highest
    1-minute load average sampled since the run started, and its command the bench's own command line
    (``command=`` names another, e.g. with an environment variable it needs)."""

    def __init__(self, parser: argparse.ArgumentParser, args: argparse.Namespace):
        self.path: Path = args.json
        self.command = command_line(parser, sys.argv[1:])
        self.rows: list[Figure] = []
        self.loads = [os.getloadavg()[0]]
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.wait(5.0):
            self.loads.append(os.getloadavg()[0])

    def load(self) -> str:
        self.loads.append(os.getloadavg()[0])
        low, high = f"{min(self.loads):.1f}", f"{max(self.loads):.1f}"
        return f"{low if low == high else f'{low}–{high}'} on {os.cpu_count()} cores"

    def add(
        self,
        id: str,
        measure: str,
        figure: str,
        compared_with: str = NONE,
        target: str = NONE,
        command: str | None = None,
    ) -> None:
        row = Figure(
            id=id,
            measure=measure,
            figure=figure,
            compared_with=compared_with,
            target=target,
            load=self.load(),
            command=command or self.command,
        )
        self.rows.append(row)

    def adopt(self, path: Path) -> None:
        """Take the rows a child process of this bench wrote to ``path``, under this run's command."""
        self.rows += [msgspec.structs.replace(row, command=self.command) for row in read(path)]

    def write(self) -> None:
        """Print this run's rows (each measure, then its figure, baseline and target) and merge them
        into the results file (nothing when the run measured nothing)."""
        self._stop.set()
        if self.rows:
            for row in self.rows:
                print(f"\n{row.measure}\n  {row.figure}")
                for name, cell in (("compared with", row.compared_with), ("target", row.target)):
                    if cell != NONE:
                        print(f"  {name}: {cell}")
            print(f"\nload average {self.load()}")
            write(self.path, self.rows)
            print(f"bench: {len(self.rows)} figures written to {self.path}", file=sys.stderr)


def met(ok: bool) -> str:
    return "met" if ok else "not met"


def build_name(checkout: Path) -> str:
    """A checkout as a row names it: its commit (``commit `abc1234```), else its folder's name."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return f"commit `{done.stdout.strip()}`" if done.returncode == 0 else f"`{checkout.resolve().name}`"


def faster(ours: float, theirs: float, digits: int = 1) -> str:
    """How our time compares with theirs: ``2.1× faster`` or ``1.3× slower`` (``digits`` after the
    point: two say whether a figure close to another held)."""
    if ours <= 0 or theirs <= 0:
        return "not comparable"
    return f"{theirs / ours:.{digits}f}× faster" if theirs >= ours else f"{ours / theirs:.{digits}f}× slower"
