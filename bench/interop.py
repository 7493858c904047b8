"""bench/interop: export and import rates, each beside a baseline measured in the same process.

- Parquet export of a store's events (``amb export parquet``'s layout: a file per group of runs,
  replay/export/parquet.py) in events/s, wall and per CPU-second, beside one file per run
  (measured in the same process, rounds in rotating order) and DuckDB's plain,
  unpartitioned ``COPY events TO x.parquet``; then the export of everything (events, every view,
  scores). Target: >= 500k events/s. ``--check`` reads every exported table back and compares it
  with the store, row for row and value for value. The store is built like bench/ingest's
  (synthetic runs through the real spool path, then ``amb ingest``): default 200 runs x 1,000
  events, ``--runs 1000`` for the 1M-event store, or ``--store DIR`` for an existing one
  (``./just bench ingest --keep DIR``).
- OTel and ATIF export rates (events/s, runs/s) on the same store.
- ``amb import automedbench`` of N seg run folders (built from the writer code, as in the tests),
  parse + write + ingest, in runs/s (target: >= 20 runs/s), and its ratio to ``amb generate`` +
  ingest of the same number of events through the same spool path.

Run: ./just bench interop [--runs 200] [--per-run 1000] [--store DIR] [--folders 100] [--rounds 3]
     [--events-per-file N] [--check] [--only parquet|import]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import duckdb

from bench import figures
from bench.measure import generate_runs, timed, tree_bytes
from recorder.importers import automedbench
from recorder.synthetic import generate_run
from replay.export.atif import export_run
from replay.export.otel import line
from replay.export.parquet import EVENTS_PER_FILE, INDEX, Written, export, read_glob
from replay.ingest import ingest
from replay.read import iter_events, run_ids
from replay.store import Store


class Timed:
    """Wall and CPU seconds of a block (CPU: every thread of this process, DuckDB's included).

    On a shared machine the wall time mostly measures how much of a core the process was given;
    CPU seconds measure the work, and events per CPU-second times the cores it can use is what
    a quiet machine would read."""

    def __enter__(self) -> Timed:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def file_per_run(con: duckdb.DuckDBPyConnection, out: Path) -> None:
    """One file per run, snappy: the layout the run groups are measured against."""
    con.execute("SET preserve_insertion_order = false")
    con.execute(f"COPY events TO '{out}' (FORMAT parquet, PARTITION_BY (run_id), COMPRESSION snappy)")
    con.execute("SET preserve_insertion_order = true")


class Measured:
    """Wall, CPU and bytes of every round of one way to write the events."""

    def __init__(self, label: str) -> None:
        self.label, self.bytes = label, 0
        self.times: list[Timed] = []

    def wall(self) -> float:
        return statistics.median(t.wall for t in self.times)

    def cpu(self) -> float:
        return statistics.median(t.cpu for t in self.times)


def parquet_round(
    root: Path, work: Path, per_file: int, ways: dict[str, Measured], order: int
) -> tuple[int, list[Written]]:
    """One round of every way to write the events (in a rotating order), then the full export."""
    with Store.open(root, read_only=True) as st:
        n = st.con.execute("SELECT count(*) FROM events").fetchall()[0][0]

        def groups() -> None:
            export(st.con, work / "groups", only=["events"], events_per_file=per_file)

        def by_run() -> None:
            file_per_run(st.con, work / "by_run")

        def plain() -> None:
            st.con.execute(f"COPY events TO '{work / 'plain.parquet'}' (FORMAT parquet, COMPRESSION snappy)")

        jobs = {"groups": (groups, work / "groups"), "by_run": (by_run, work / "by_run")}
        jobs["plain"] = (plain, work / "plain.parquet")
        globs = {"groups": f"{work}/groups/events/*/*.parquet", "by_run": f"{work}/by_run/*/*.parquet"}
        names = list(jobs)
        for name in names[order % len(names) :] + names[: order % len(names)]:
            fn, path = jobs[name]
            with Timed() as t:
                fn()
            ways[name].times.append(t)
            ways[name].bytes = tree_bytes(path)
            glob = globs.get(name, str(path))
            back = duckdb.execute(f"SELECT count(*) FROM read_parquet('{glob}')").fetchall()[0][0]
            assert back == n, (name, back, n)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        with Timed() as t:
            written = export(st.con, work / "full", events_per_file=per_file)
        ways["full"].times.append(t)
        ways["full"].bytes = tree_bytes(work / "full")
        shutil.rmtree(work / "full")
    return n, written


def check_readback(root: Path, work: Path, per_file: int) -> None:
    """Every table of a full export read back: the same rows with the same values, both ways."""
    out = work / "check"
    with Store.open(root, read_only=True) as st, Timed() as t:
        written = export(st.con, out, events_per_file=per_file)
        for w in written:
            if w.name == INDEX:
                continue
            cols = [r[0] for r in st.con.execute(f'DESCRIBE SELECT * FROM "{w.name}"').fetchall()]
            listed = ", ".join(f'"{c}"' for c in cols)
            src, back = (
                f'SELECT {listed} FROM "{w.name}"',
                f"SELECT {listed} FROM {read_glob(out, w.name, w.partitioned)}",
            )
            counts = [st.con.execute(f"SELECT count(*) FROM ({q})").fetchall()[0][0] for q in (src, back)]
            diffs = [
                st.con.execute(f"SELECT count(*) FROM ({a} EXCEPT ALL {b})").fetchall()[0][0]
                for a, b in ((src, back), (back, src))
            ]
            assert counts[0] == counts[1] == w.rows and diffs == [0, 0], (w, counts, diffs)
            print(f"  {w.name}: {w.rows:,} rows read back identical")
    shutil.rmtree(out)
    print(f"  read back and compared in {t.wall:.1f} s")


def import_folders(tmp: Path, count: int) -> list[Path]:
    from tests.recorder.importers import amb_fixtures as fx

    first = fx.seg_local(tmp / "src", "kidney-seg", "kidney", tmp)
    folders = [first]
    for i in range(1, count):
        dest = first.parent / f"260412-{i:06x}"
        shutil.copytree(first, dest)
        folders.append(dest)
    return folders


def _parse_one(folder: Path) -> list:
    from tasks.registry import canonical_id

    return [automedbench.parse(folder, resolve_task=canonical_id)]


def import_round(folders: list[Path], store: Path) -> tuple[Timed, int]:
    """``amb import automedbench`` as the command runs it (threads, write, ingest), timed."""
    from amb.interop_cmds import run_imports

    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    with Timed() as t:
        outcomes = run_imports(
            str(store),
            ((str(f), partial(_parse_one, f)) for f in folders),
            len(folders),
            "import",
        )
    assert all(o.status == "imported" for o in outcomes), outcomes[:3]
    events = sum(int(o.detail.split()[0]) for o in outcomes)
    return t, events


def generate_round(store: Path, runs: int, events_per_run: int) -> Timed:
    """Baseline: the synthetic writer through the same spool path, about as many events, then ingest."""
    shutil.rmtree(store, ignore_errors=True)
    calls = max(1, round(events_per_run / 4))
    with Timed() as t:
        for i in range(runs):
            generate_run(store, f"g-{i:05d}", seed=i, calls=calls, sync=True)
        ingest(store)
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--per-run", type=int, default=1000)
    ap.add_argument("--store", metavar="DIR", help="an existing store to export (skips building one)")
    ap.add_argument("--folders", type=int, default=100, help="AutoMedBench run folders to import")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events-per-file", type=int, default=EVENTS_PER_FILE, help="the export's run groups")
    ap.add_argument("--check", action="store_true", help="also read every exported table back and compare")
    ap.add_argument("--only", choices=["parquet", "import"], help="run only this part")
    figures.add_argument(ap, "interop")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="amb-bench-interop-") as tmp_s:
        tmp = Path(tmp_s)
        root = Path(args.store) if args.store else tmp / "store"
        if not args.store:
            generate_runs(root, args.runs, args.per_run, report_every=100)
            ingest(root)
        if args.only != "import":
            parquet(root, tmp, args, figs)
        if args.only != "parquet":
            others(root, tmp, args, figs)
    print(f"load average at end: {os.getloadavg()}")
    figs.write()


def parquet(root: Path, tmp: Path, args: argparse.Namespace, figs: figures.Figures) -> None:
    ways = {k: Measured(k) for k in ("groups", "by_run", "plain", "full")}
    n, written = 0, list[Written]()
    for i in range(args.rounds):
        n, written = parquet_round(root, tmp, args.events_per_file, ways, i)
        print(f"  round {i + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    files = next(w.rows for w in written if w.name == INDEX)
    label = {
        "groups": f"run groups of >= {args.events_per_file:,} events (amb export parquet, events only)",
        "by_run": "one file per run",
        "plain": "DuckDB's plain COPY events, one file (no partitioning)",
        "full": "amb export parquet of everything (events, every view, scores)",
    }
    print(f"parquet export of {n:,} events, {files:,} runs, medians of {args.rounds} rounds (order rotated):")
    for k, m in ways.items():
        print(
            f"  {label[k]}: {m.wall():.2f} s = {n / m.wall():,.0f} events/s wall; "
            f"CPU {m.cpu():.2f} s = {n / m.cpu():,.0f} events per CPU-second; "
            f"{m.bytes / 1e6:,.1f} MB; {m.cpu() / m.wall():.2f} cores"
        )
    g, b, p = ways["groups"], ways["by_run"], ways["plain"]
    print(
        f"  run groups vs one file per run: {b.wall() / g.wall():.2f}x wall, {b.cpu() / g.cpu():.2f}x CPU; "
        f"vs the plain COPY: {p.wall() / g.wall():.2f}x wall, {p.cpu() / g.cpu():.2f}x CPU"
    )
    cores = os.cpu_count() or 1
    print(
        f"  upper bound with all {cores} cores and nothing else running: {n / g.cpu() * cores:,.0f} "
        f"events/s (the export is CPU-bound; it got {g.cpu() / g.wall():.2f} cores here)"
    )
    figs.add(
        "parquet",
        f"Parquet export of {n:,} events in {files:,} runs, a file per group of runs, "
        f"medians of {args.rounds} ([layout](docs/interop.md#parquet))",
        f"**{n / g.wall():,.0f} events/s** ({g.wall():.2f} s on {g.cpu() / g.wall():.2f} cores)",
        f"a file per run: {n / b.wall():,.0f} (groups {figures.faster(g.wall(), b.wall())}); "
        f"DuckDB's one-file `COPY`: {n / p.wall():,.0f}",
        f"≥ 500,000 events/s ({figures.met(n / g.wall() >= 500_000)})",
    )
    full = ways["full"]
    figs.add(
        "parquet-all",
        "Parquet export of everything (events, every view and score table)",
        f"{n / full.wall():,.0f} events/s ({full.wall():.2f} s)",
    )
    if args.check:
        check_readback(root, tmp, args.events_per_file)


def others(root: Path, tmp: Path, args: argparse.Namespace, figs: figures.Figures) -> None:
    with Store.open(root, read_only=True) as st:
        ids = run_ids(st.con)[:50]
        t0 = time.perf_counter()
        n_ev = 0
        for r in ids:
            evs = list(iter_events(st.con, r))
            n_ev += len(evs)
            line(evs)
        dt = time.perf_counter() - t0
        print(f"otel export, {len(ids)} runs, {n_ev:,} events: {n_ev / dt:,.0f} events/s")
        figs.add(
            "otel", f"OpenTelemetry export of {len(ids)} runs ({n_ev:,} events)", f"{n_ev / dt:,.0f} events/s"
        )
        _, dt = timed(lambda: [export_run(st.con, st.blobs.get, r, tmp / "atif") for r in ids])
        print(f"atif export, {len(ids)} runs: {len(ids) / dt:,.1f} runs/s")
        figs.add(
            "atif",
            f"ATIF export of {len(ids)} runs (every request body read)",
            f"{len(ids) / dt:,.1f} runs/s",
        )
    folders = import_folders(tmp / "amb", args.folders)
    imp, gen = [], []
    events = 0
    for _ in range(args.rounds):
        t, events = import_round(folders, tmp / "imported")
        imp.append(t)
        gen.append(generate_round(tmp / "generated", len(folders), events // len(folders)))
    i, g = statistics.median(x.wall for x in imp), statistics.median(x.wall for x in gen)
    ic = statistics.median(x.cpu for x in imp)
    print(
        f"import automedbench, {len(folders)} seg folders ({events:,} events): {i:.2f} s = "
        f"{len(folders) / i:,.1f} runs/s; generate+ingest of as many runs and events: {g:.2f} s; "
        f"ratio {g / i:.2f}x (medians of {args.rounds})"
    )
    per_run = ic * 1000 / len(folders)
    print(f"  CPU: {per_run:.1f} ms per run = {len(folders) / ic:,.1f} runs per CPU-second")
    figs.add(
        "import",
        f"`amb import automedbench` of {len(folders)} seg run folders ({events:,} events): parse, write, "
        f"ingest; medians of {args.rounds}",
        f"**{len(folders) / i:,.1f} runs/s** ({len(folders) / ic:,.0f} per CPU-second)",
        f"`amb generate` + ingest of as many runs and events: {g:.2f} s (import {figures.faster(i, g)})",
        f"≥ 20 runs/s ({figures.met(len(folders) / i >= 20)})",
    )


if __name__ == "__main__":
    main()
