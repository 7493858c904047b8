"""bench/scale: the same commands on a small and a large store, and how their cost grows.

Makes two stores with ``amb generate``'s default run shape (35 model calls per run), default 1,000
and 8,000 runs (``--small``, ``--large``), and measures on each every command of ``SHOWN`` as its own
child process (``amb ...``, as a user runs it): wall time, CPU time and peak resident memory (the
child's own, from ``wait4``), per event, and the ratio large ÷ small. The LLM judge's verdicts are
all cached first (by a loopback fake judge, not measured); the cold ``amb sql`` drops the database
file from the page cache first.

With ``--against CHECKOUT`` (a previous build, with its own ``.venv``: ``git worktree add --detach
../prev COMMIT`` and ``./just default`` there), that build's ``amb`` runs each command too, right
after this build's, on a copy of the same store. With ``--rounds N`` every figure is the median of
N rounds, on fresh copies.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench import figures
from bench.measure import Usage, evict, run_measured, spool_bodies, workdir

AGGREGATE = (
    "SELECT model, count(*) AS calls, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out "
    "FROM model_calls GROUP BY model ORDER BY model"
)

MB = 1 << 20
TIME_RATIO, MEMORY_RATIO, MEMORY_CAP = 1.15, 1.2, 1 << 30
"""The targets, for 8× the work: time per event and peak memory large ÷ small, peak memory."""


class Store(NamedTuple):
    root: Path
    runs: int
    events: int


class Build(NamedTuple):
    """A build of amb: its name in the table, its checkout and that checkout's ``amb`` executable."""

    name: str
    checkout: Path

    @property
    def amb(self) -> Path:
        return self.checkout / ".venv" / "bin" / "amb"

    def env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """``env`` (else the bench's own) with the build's checkout first on the import path: a
        ``PYTHONPATH`` the bench was started with would otherwise have every build import that
        code, and a venv shared with another checkout its code."""
        return {**(env if env is not None else os.environ), "PYTHONPATH": str(self.checkout)}


def generate(root: Path, runs: int) -> Store:
    """``runs`` runs of ``amb generate``'s default shape in a new store at ``root`` (spools and blobs,
    not ingested); reused when ``root`` already holds them (``--work``)."""
    done = root / "generated.json"
    if done.is_file():
        meta = json.loads(done.read_text())
        if meta["runs"] == runs:
            return Store(root, runs, meta["events"])
    if root.exists():
        shutil.rmtree(root)
    print(f"generating {runs:,} runs into {root}...", file=sys.stderr)
    t0 = time.perf_counter()
    this = Build("this", Path(__file__).resolve().parents[1])
    subprocess.run([this.amb, "generate", "--store", root, "--runs", str(runs)], check=True, env=this.env())
    events = sum(map(len, spool_bodies(root)))
    print(f"  {events:,} events in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    done.write_text(json.dumps({"runs": runs, "events": events}))
    return Store(root, runs, events)


def fresh_copy(store: Store, into: Path) -> Store:
    """A copy of a generated store (spools and blobs, no database), for one build's ingest."""
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(store.root, into, ignore=shutil.ignore_patterns("amb.duckdb*"))
    return store._replace(root=into)


def amb(build: Build, *args: object, env: dict[str, str] | None = None) -> Usage:
    """One ``amb`` command of ``build``, measured; its output is discarded (the command must succeed)."""
    return run_measured([build.amb, *map(str, args)], env=build.env(env))


def viewer_session(build: Build, store: Store, run_id: str) -> Usage:
    """``amb serve`` started, asked for the runs page and a run page deep-linked to the run's middle
    event, then stopped: the wall time of the answers (the first of each, nothing cached), the
    process's CPU time and peak memory over the whole session (its start included)."""
    source, seq = middle_event(store, run_id)
    port_file = store.root / "serve.err"
    with open(port_file, "w") as err:
        proc = subprocess.Popen(
            [build.amb, "serve", "--store", store.root, "--port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=build.env(),
        )
    try:
        url = wait_for_url(port_file, proc)
        t0 = time.perf_counter()
        fetch(f"{url}api/runs?limit=50")
        fetch(f"{url}api/runs/{run_id}")
        fetch(f"{url}api/runs/{run_id}/events?around={source}:{seq}")
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped here, by wait4, for its usage
    return Usage(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)


def middle_event(store: Store, run_id: str) -> tuple[str, int]:
    """The (source, seq) of the middle event of a run, in the viewer's order (not measured)."""
    import duckdb

    with duckdb.connect(str(store.root / "amb.duckdb"), read_only=True) as con:
        row = con.execute(
            "SELECT source, seq FROM events WHERE run_id = ? ORDER BY ts_ns, source, seq "
            "LIMIT 1 OFFSET (SELECT count(*) // 2 FROM events WHERE run_id = ?)",
            [run_id, run_id],
        ).fetchone()
    assert row is not None, run_id
    return row[0], row[1]


def wait_for_url(err: Path, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = err.read_text()
        if "http://" in text:
            return "http://" + text.split("http://", 1)[1].split()[0]
        if proc.poll() is not None:
            raise SystemExit(f"amb serve ended before it listened:\n{text}")
        time.sleep(0.05)
    raise SystemExit("amb serve did not listen within 120 s")


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as r:
        return r.read()


def cached_llm_score(build: Build, store: Store, judge_url: str) -> Usage:
    """``amb score --all --judge llm`` with every verdict cached: the loopback fake judge at
    ``judge_url`` is asked every item of every run by a first scoring (not measured; with more
    runs at once than the default, as its time is spent waiting for the judge's answers)."""
    env = {**os.environ, "AMB_JUDGE_BASE_URL": judge_url, "AMB_JUDGE_MODEL": "fake-judge"}
    amb(build, "score", "--all", "--judge", "llm", "--jobs", "8", "--store", store.root, env=env)
    return amb(build, "score", "--all", "--judge", "llm", "--store", store.root, env=env)


def cold_sql(build: Build, store: Store) -> Usage:
    """The aggregate with the database file dropped from the page cache first."""
    evict([store.root / "amb.duckdb"])
    return amb(build, "sql", AGGREGATE, "--store", store.root)


def python_scan(build: Build, store: Store) -> Usage | None:
    """``amb scan`` of a Python scanner over every run (bench/scan.py's check), or None for a build
    that has no ``amb scan``."""
    from bench.scan import PY

    if subprocess.run([build.amb, "scan", "--help"], capture_output=True, env=build.env()).returncode != 0:
        return None
    path = store.root / "first_shell.py"
    path.write_text(PY.format(tag=build.name))
    return amb(build, "scan", path, "--all", "--store", store.root)


COMMANDS: dict[str, Callable[[Build, Store], Usage | None]] = {
    "ingest": lambda b, s: amb(b, "ingest", "--spools", "keep", "--store", s.root),
    "verify": lambda b, s: amb(b, "verify", "--store", s.root),
    "score offline": lambda b, s: amb(b, "score", "--all", "--judge", "offline", "--store", s.root),
    "report": lambda b, s: amb(b, "report", "--json", "--store", s.root),
    "sql cold": lambda b, s: cold_sql(b, s),
    "sql warm": lambda b, s: amb(b, "sql", AGGREGATE, "--store", s.root),
    "viewer": lambda b, s: viewer_session(b, s, f"synth-{s.runs // 2:04d}"),
    "export parquet": lambda b, s: amb(
        b, "export", "parquet", "--overwrite", "--store", s.root, s.root / "pq"
    ),
    "scan": python_scan,
}
"""Each measured command, in the order they run on a store (ingest first: the others read its result)."""

NEEDS = {"report": "score offline"}
"""A command that reads what another writes: that one runs first even when not asked for."""

SHOWN = {
    "ingest": "`amb ingest`",
    "verify": "`amb verify`",
    "score offline": "`amb score --all --judge offline`",
    "score llm cached": "`amb score --all --judge llm`, every verdict cached",
    "report": "`amb report --json`",
    "sql cold": "`amb sql` aggregate, cold",
    "sql warm": "`amb sql` aggregate, warm",
    "viewer": "`amb serve`: runs page + deep-linked run page",
    "export parquet": "`amb export parquet`",
    "scan": "`amb scan` of a Python scanner, every run",
}


def _with_llm(judge_url: str) -> dict[str, Callable[[Build, Store], Usage | None]]:
    """``COMMANDS`` with the cached-LLM scoring after the offline one (it needs the fake judge)."""
    out: dict[str, Callable[[Build, Store], Usage | None]] = {}
    for name, command in COMMANDS.items():
        out[name] = command
        if name == "score offline":
            out["score llm cached"] = lambda b, s: cached_llm_score(b, s, judge_url)
    return out


def measure_rounds(
    builds: list[Build], store: Store, work: Path, only: set[str], judge_url: str, rounds: int
) -> dict[str, dict[str, Usage]]:
    """``measure_store`` ``rounds`` times (fresh copies each time, the builds' order turned round
    every other round so that neither always goes first), each figure the median of its rounds:
    one measurement of a command can swing by a third on a shared machine."""
    got = [measure_store(builds[:: -1 if r % 2 else 1], store, work, only, judge_url) for r in range(rounds)]
    out: dict[str, dict[str, Usage]] = {}
    for name, per_build in got[0].items():
        for b in per_build:
            usages = [g[name][b] for g in got]
            out.setdefault(name, {})[b] = Usage(
                statistics.median(u.wall for u in usages),
                statistics.median(u.cpu for u in usages),
                int(statistics.median(u.rss for u in usages)),
            )
    return out


def measure_store(
    builds: list[Build], store: Store, work: Path, only: set[str], judge_url: str
) -> dict[str, dict[str, Usage]]:
    """Every command of ``only`` on ``store``, for each build on its own copy: {command: {build: usage}}."""
    copies = {b.name: fresh_copy(store, work / f"{store.root.name}-{i}") for i, b in enumerate(builds)}
    # (the copies on disk first: the first build's command would otherwise wait for their writeback)
    os.sync()
    out: dict[str, dict[str, Usage]] = {}
    needed = {"ingest", *only, *(NEEDS[n] for n in only if n in NEEDS)}
    for name, command in _with_llm(judge_url).items():
        if name not in needed:
            continue
        for b in builds:
            usage = command(b, copies[b.name])
            if usage is None:
                print(f"  {store.runs:,} runs, {b.name}: {name:16} (not in this build)", file=sys.stderr)
                continue
            print(f"  {store.runs:,} runs, {b.name}: {name:16} {usage}", file=sys.stderr)
            if name in only or name == "ingest":  # (a command run only for another's sake: no row)
                out.setdefault(name, {})[b.name] = usage
    for copy in copies.values():
        shutil.rmtree(copy.root, ignore_errors=True)
    return out


def per(u: Usage, n: int, unit: float) -> str:
    return f"{u.wall / n * unit:.1f}"


def table_lines(
    small: Store, large: Store, got: list[dict[str, dict[str, Usage]]], builds: list[Build]
) -> list[str]:
    lines = [
        f"{'command':52} {'build':10} {'small s':>8} {'large s':>8} {'µs/event S':>11} {'µs/event L':>11} "
        f"{'time ×':>7} {'CPU ×':>6} {'MB S':>6} {'MB L':>6} {'mem ×':>6}"
    ]
    for name in got[0]:
        for b in builds:
            if b.name not in got[0][name]:
                continue
            s, l_ = got[0][name][b.name], got[1][name][b.name]
            lines.append(
                f"{SHOWN[name]:52} {b.name:10} {s.wall:8.2f} {l_.wall:8.2f} {per(s, small.events, 1e6):>11} "
                f"{per(l_, large.events, 1e6):>11} {ratio(s.wall, small, l_.wall, large):7.2f} "
                f"{ratio(s.cpu, small, l_.cpu, large):6.2f} {s.rss / MB:6.0f} {l_.rss / MB:6.0f} "
                f"{l_.rss / s.rss:6.2f}"
            )
    return lines


def ratio(small_v: float, small: Store, large_v: float, large: Store) -> float:
    """Large ÷ small, per event: 1.0 is linear."""
    return (large_v / large.events) / (small_v / small.events)


def row_command(figs: figures.Figures, name: str) -> str:
    """The bench's command as it measures one command (each is measured on its own): the row says
    how to measure that one again, and stays short whatever ``--only`` listed."""
    words, kept = shlex.split(figs.command), []
    while words:
        word = words.pop(0)
        if word == "--only":
            while words and not words[0].startswith("--"):
                words.pop(0)
        else:
            kept.append(word)
    return shlex.join([*kept, "--only", name])


def add_rows(
    figs: figures.Figures,
    small: Store,
    large: Store,
    got: list[dict[str, dict[str, Usage]]],
    ours: str,
    against: str | None,
) -> None:
    for name in got[0]:
        s, l_ = got[0][name][ours], got[1][name][ours]
        time_x = ratio(s.wall, small, l_.wall, large)
        ok = time_x <= TIME_RATIO and l_.rss <= MEMORY_RATIO * s.rss and l_.rss < MEMORY_CAP
        beside = "—"
        if against and against in got[1][name]:
            p = got[1][name][against]
            beside = f"previous build: {p.wall:.1f} s, {p.rss / MB:,.0f} MB"
        figs.add(
            f"scale-{name.replace(' ', '-')}",
            f"{SHOWN[name]}, {small.runs:,} → {large.runs:,} runs ({large.events:,} events)",
            f"{s.wall:.1f} → {l_.wall:.1f} s ({time_x:.2f}× per event); {s.rss / MB:,.0f} → "
            f"{l_.rss / MB:,.0f} MB ({l_.rss / s.rss:.2f}×)",
            beside,
            f"≤ {TIME_RATIO}× per event, ≤ {MEMORY_RATIO}× and < 1 GB memory ({figures.met(ok)})",
            command=row_command(figs, name),
        )


RATED = ("ingest", "verify")
"""The commands whose rate on runs shaped like real ones is a row of its own, beside the rate the
light set of ``bench/ingest.py`` gives (few bodies: the same runs ingest several times faster)."""


def add_rate_rows(
    figs: figures.Figures, large: Store, got: dict[str, dict[str, Usage]], ours: str, against: str | None
) -> None:
    """Events per second of ``RATED`` on the large store, beside the other build's in the same run."""
    for name in RATED:
        if name not in got:
            continue
        u = got[name][ours]
        beside = figures.NONE
        if against:
            p = got[name][against]
            beside = (
                f"previous build: {large.events / p.wall:,.0f} events/s, CPU {p.cpu:.1f} s "
                f"({figures.faster(u.wall, p.wall, 2)})"
            )
        figs.add(
            f"scale-{name}-rate",
            f"{SHOWN[name]} of {large.runs:,} runs shaped like real ones ({large.events:,} events: 35 model "
            "calls each, every call with its request and response bodies)",
            f"**{large.events / u.wall:,.0f} events/s** ({u.wall:.1f} s, CPU {u.cpu:.1f} s)",
            beside,
            command=row_command(figs, name),
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=1000, help="runs in the small store")
    ap.add_argument("--large", type=int, default=8000, help="runs in the large store")
    ap.add_argument("--work", metavar="DIR", help="keep the generated stores here (reused by the next run)")
    ap.add_argument(
        "--only", nargs="+", choices=[*COMMANDS, "score llm cached"], help="measure these commands"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="measure each store this many times; figures are medians"
    )
    ap.add_argument(
        "--against", metavar="CHECKOUT", type=Path, help="another build, measured beside this one"
    )
    figures.add_argument(ap, "scale")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    builds = [Build("this", Path(__file__).resolve().parents[1])]
    if args.against:
        builds.append(Build("previous", args.against.resolve()))
    only = set(args.only or [*COMMANDS, "score llm cached"])
    from tests.fakes import judge_server as fake

    with (
        workdir(args.work, "amb-bench-scale-") as work,
        fake.JudgeServer(fake.default_policy, keep_requests=False) as judge,
    ):
        stores = [generate(work / f"gen-{n}", n) for n in (args.small, args.large)]
        got = [measure_rounds(builds, st, work, only, judge.base_url, max(args.rounds, 1)) for st in stores]
    small, large = stores
    print("\n".join(table_lines(small, large, got, builds)))
    add_rows(figs, small, large, got, builds[0].name, builds[1].name if args.against else None)
    add_rate_rows(figs, large, got[1], builds[0].name, builds[1].name if args.against else None)
    figs.write()


if __name__ == "__main__":
    main()
