"""bench/interop: export and import rates, each beside a baseline measured in the same process.

- Parquet export of a store (events + every view + scores, hive-partitioned by run) in events/s,
  and its ratio to DuckDB's plain, unpartitioned ``COPY events TO x.parquet`` of the same events
  (target: >= 500k events/s). The store is built like bench/ingest's (synthetic runs through the
  real spool path, then ``amb ingest``): default 200 runs x 1,000 events, ``--runs 1000`` for the
  1M-event store, or ``--store DIR`` for an existing one (``./just bench ingest --keep DIR``).
- OTel and ATIF export rates (events/s, runs/s) on the same store.
- ``amb import automedbench`` of N seg run folders (built from the writer code, as in the tests),
  parse + write + ingest, in runs/s (target: >= 20 runs/s), and its ratio to ``amb generate`` +
  ingest of the same number of events through the same spool path.

Run: ./just bench interop [--runs 200] [--per-run 1000] [--store DIR] [--folders 100] [--rounds 3]
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

from recorder.importers import automedbench
from recorder.synthetic import generate_run
from replay.export.atif import export_run
from replay.export.otel import line
from replay.export.parquet import export
from replay.ingest import ingest
from replay.read import iter_events, run_ids
from replay.store import Store


def build_store(root: Path, runs: int, per_run: int) -> None:
    procs = max(1, round((per_run - 110) / 34))
    t0 = time.perf_counter()
    for i in range(runs):
        generate_run(root, f"bench-{i:05d}", seed=i, calls=35, processes_per_call=procs)
        if i % 100 == 99:
            print(f"  generated {i + 1}/{runs} runs ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    ingest(root)


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


def parquet_round(root: Path, work: Path) -> tuple[Timed, Timed, Timed, int]:
    """(events-only export, full export, plain COPY, events)."""
    out, plain = work / "pq", work / "plain.parquet"
    times = []
    with Store.open(root, read_only=True) as st:
        n = st.con.execute("SELECT count(*) FROM events").fetchall()[0][0]
        with Timed() as base:
            st.con.execute(f"COPY events TO '{plain}' (FORMAT parquet, COMPRESSION snappy)")
        plain.unlink()
        for only in (["events"], None):
            shutil.rmtree(out, ignore_errors=True)
            with Timed() as t:
                export(st.con, out, only=only)
            times.append(t)
            back = duckdb.execute(
                f"SELECT count(*) FROM read_parquet('{out}/events/**/*.parquet', hive_partitioning = true)"
            ).fetchall()[0][0]
            assert back == n, (back, n)
    shutil.rmtree(out, ignore_errors=True)
    return times[0], times[1], base, n


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
    ap.add_argument("--store", help="an existing store to export (skips building one)")
    ap.add_argument("--folders", type=int, default=100, help="AutoMedBench run folders to import")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="amb-bench-interop-") as tmp_s:
        tmp = Path(tmp_s)
        root = Path(args.store) if args.store else tmp / "store"
        if not args.store:
            build_store(root, args.runs, args.per_run)
        ev_only, full, base = [], [], []
        n = 0
        for _ in range(args.rounds):
            te, tf, tb, n = parquet_round(root, tmp)
            ev_only.append(te)
            full.append(tf)
            base.append(tb)
        e, f, b = (statistics.median(x.wall for x in t) for t in (ev_only, full, base))
        ec, fc, bc = (statistics.median(x.cpu for x in t) for t in (ev_only, full, base))
        print(
            f"parquet export of {n:,} events, partitioned by run: {e:.2f} s = {n / e:,.0f} events/s; "
            f"plain unpartitioned COPY events: {b:.2f} s = {n / b:,.0f} events/s; ratio {b / e:.2f}x"
        )
        print(
            f"  CPU: {ec:.2f} s = {n / ec:,.0f} events per CPU-second (plain COPY {n / bc:,.0f}); "
            f"this process got {ec / e:.2f} cores of the machine's {os.cpu_count()}"
        )
        print(
            f"parquet export of everything (events, every view, scores): {f:.2f} s = {n / f:,.0f} "
            f"events/s, {n / fc:,.0f} per CPU-second; ratio to the plain COPY {b / f:.2f}x "
            f"(medians of {args.rounds})"
        )
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
            t0 = time.perf_counter()
            for r in ids:
                export_run(st.con, st.blobs.get, r, tmp / "atif")
            dt = time.perf_counter() - t0
            print(f"atif export, {len(ids)} runs: {len(ids) / dt:,.1f} runs/s")
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
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
