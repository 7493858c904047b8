"""What several benches measure the same way (time, CPU, memory, bytes on disk, the page cache),
and the synthetic stores and baselines they measure it on."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple, TypeVar

import duckdb

T = TypeVar("T")

AGGREGATE = """
SELECT run_id, model, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out, count(*) AS calls
FROM model_calls GROUP BY run_id, model ORDER BY run_id
"""
"""The aggregate query the storage benches time: tokens per model per run."""

BLOB_REFS = r"""SELECT unnest(regexp_extract_all(payload, '"blob":"(sha256:[0-9a-f]{64})"', 1)) FROM events"""
"""Every blob reference of every event, one row each (a blob referred to twice is two rows)."""


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and the wall seconds it took."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def repeat(fn: Callable[[], object], times: int) -> list[float]:
    """The wall seconds of each of ``times`` calls of ``fn``."""
    return [timed(fn)[1] for _ in range(times)]


def alternate(
    contenders: dict[str, Callable[[], T]], rounds: int, rotate: bool = False
) -> dict[str, list[T]]:
    """Each contender's results of ``rounds`` rounds, the contenders taking turns within a round (with
    ``rotate``, each round starting one further along), so that load from elsewhere on the machine
    falls on all of them alike."""
    out: dict[str, list[T]] = {name: [] for name in contenders}
    names = list(contenders)
    for i in range(rounds):
        start = i % len(names) if rotate else 0
        for name in names[start:] + names[:start]:
            out[name].append(contenders[name]())
    return out


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``values``: the nearest of them, no interpolation."""
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


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


def process_cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of another live process (from /proc), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb() -> float:
    """This process's resident set size now, in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """The largest resident set size this process has had, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spent(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, and the wall and the CPU seconds (``cpu_seconds``) the call took."""
    cpu = cpu_seconds()
    out, wall = timed(fn)
    return out, wall, cpu_seconds() - cpu


def costed(fn: Callable[[], object]) -> tuple[float, float]:
    """The wall and the CPU seconds (``cpu_seconds``) of a call of ``fn``."""
    _, wall, cpu = spent(fn)
    return wall, cpu


def tree_bytes(path: Path) -> int:
    """The apparent size of a file, or of every file below a folder."""
    if not path.is_dir():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def disk_bytes(path: Path) -> int:
    """The bytes a file, or a folder and everything below it, takes on disk: its allocated blocks
    (what ``du`` counts), not its content's length."""
    if not path.is_dir():
        return os.lstat(path).st_blocks * 512
    return sum(os.lstat(p).st_blocks * 512 for p in [path, *path.rglob("*")])


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


def synthetic_store(store: Path, runs: int, calls: int) -> None:
    """``runs`` synthetic runs of ``calls`` model calls each in ``store``, ingested; the runs it
    already holds (``--store`` of an earlier run) are not generated again."""
    from recorder.synthetic import generate_run
    from replay.ingest import ingest
    from replay.read import run_ids
    from replay.store import Store

    existing: set[str] = set()
    if (store / "amb.duckdb").exists():
        with Store.open(store, read_only=True) as st:
            existing = set(run_ids(st.con))
    for i in range(runs):
        if f"bench-{i:05d}" not in existing:
            generate_run(store, f"bench-{i:05d}", seed=i, calls=calls)
    ingest(store)


def spool_bodies(root: Path) -> Iterator[list[bytes]]:
    """The event bodies of each of ``root``'s spools."""
    from replay.ingest import spool_files
    from schemas.frames import scan

    for path in spool_files(root):
        yield scan(path.read_bytes()).bodies


def events_ndjson(root: Path, out: Path) -> int:
    """Every event body of ``root``'s spools, a line each, into ``out`` (``plain_load``'s input); the
    events written."""
    n = 0
    with open(out, "wb") as f:
        for bodies in spool_bodies(root):
            f.writelines(body + b"\n" for body in bodies)
            n += len(bodies)
    return n


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
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
