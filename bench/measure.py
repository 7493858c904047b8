"""What several benches measure the same way: timing a call, CPU seconds, bytes on disk, a warm page
cache, a synthetic store of a given size, and DuckDB's plain load of the events (the baseline the
storage benches compare with)."""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple, TypeVar

import duckdb

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and the wall seconds it took."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def repeat(fn: Callable[[], object], times: int) -> list[float]:
    """The wall seconds of each of ``times`` calls of ``fn``."""
    return [timed(fn)[1] for _ in range(times)]


@contextmanager
def workdir(keep: str | Path | None, prefix: str) -> Iterator[Path]:
    """The bench's work folder: ``keep`` (left in place for the next run to reuse), else a new
    temporary folder, removed at the end."""
    if keep:
        yield Path(keep)
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def cpu_seconds(children: bool = False) -> float:
    """User and system CPU time of this process (and, with ``children``, of its children that have
    ended). On a shared machine the wall time of a CPU-bound step mostly says how busy the others
    were; its CPU time says what it cost."""
    kinds = [resource.RUSAGE_SELF, *([resource.RUSAGE_CHILDREN] if children else [])]
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, kinds))


def costed(fn: Callable[[], object]) -> tuple[float, float]:
    """The wall and the CPU seconds (``cpu_seconds``) of a call of ``fn``."""
    cpu = cpu_seconds()
    _, wall = timed(fn)
    return wall, cpu_seconds() - cpu


def tree_bytes(path: Path) -> int:
    """The apparent size of a file, or of every file below a folder."""
    if not path.is_dir():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def read_through(paths: Iterable[Path]) -> None:
    """Read each file to its end, so that it is in the page cache before a warm measurement."""
    for path in paths:
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass


def generate_runs(root: Path, runs: int, per_run: int, report_every: int = 50) -> int:
    """``runs`` synthetic runs of about ``per_run`` events each into ``root``'s spools; the events
    written. About 35 model calls per run, the rest shim process events."""
    from recorder.synthetic import generate_run

    procs = max(1, round((per_run - 110) / 34))
    total = 0
    t0 = time.perf_counter()
    for i in range(runs):
        total += generate_run(root, f"bench-{i:05d}", seed=i, calls=35, processes_per_call=procs).events
        if i % report_every == report_every - 1:
            print(
                f"  generated {i + 1}/{runs} runs ({total:,} events, {time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
            )
    return total


def plain_load(ndjson: Path, db: Path) -> float:
    """DuckDB's own load of the events in ``ndjson`` into a plain table of a new database ``db``,
    timed up to the closed database."""
    db.unlink(missing_ok=True)
    t0 = time.perf_counter()
    con = duckdb.connect(str(db))
    con.execute(
        """CREATE TABLE plain AS SELECT * FROM read_ndjson(?, columns = {
               kind: 'VARCHAR', payload: 'JSON', prev_hash: 'VARCHAR', run_id: 'VARCHAR',
               seq: 'BIGINT', source: 'VARCHAR', ts_ns: 'BIGINT', v: 'INTEGER'})""",
        [str(ndjson)],
    )
    con.close()
    return time.perf_counter() - t0


class Usage(NamedTuple):
    """What a child process cost: wall seconds, CPU seconds (user and system), peak resident bytes."""

    wall: float
    cpu: float
    rss: int

    def __str__(self) -> str:
        return f"{self.wall:.2f} s wall, {self.cpu:.2f} s CPU, {self.rss / 2**20:,.0f} MB peak"


def run_measured(argv: list[object], env: dict[str, str] | None = None) -> Usage:
    """Run a command to its end (its output discarded; a failure ends the bench with its stderr) and
    measure it: ``wait4`` gives the child's own CPU time and peak memory, not the bench's."""
    import os
    import subprocess

    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, by wait4, for its usage
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{err.read().decode()}")
    return Usage(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)


def evict(paths: Iterable[Path]) -> None:
    """Drop files from the page cache (what can be dropped without root: their clean pages), so that
    the next read of them is a cold one."""
    import os

    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
