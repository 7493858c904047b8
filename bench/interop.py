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
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import duckdb

from bench import figures
from bench.measure import costed, generate_runs, spent, timed, tree_bytes
from recorder.importers import automedbench
from recorder.synthetic import generate_run
from replay.export.atif import export_run
from replay.export.otel import line
from replay.export.parquet import EVENTS_PER_FILE, INDEX, Written, export, read_glob
from replay.ingest import ingest
from replay.read import iter_events, run_ids
from replay.store import Store


class Measured:
    """Wall and CPU seconds (every thread of this process, DuckDB's included) of every round of one
    way to write the events, and the bytes it wrote: on a shared machine the CPU seconds measure the
    work, the wall time mostly how much of a core the process was given."""

    def __init__(self) -> None:
        self.bytes = 0
        self.times: list[tuple[float, float]] = []

    def wall(self) -> float:
        return statistics.median(w for w, _ in self.times)

    def cpu(self) -> float:
        return statistics.median(c for _, c in self.times)


def parquet_round(
    root: Path, work: Path, per_file: int, ways: dict[str, Measured], order: int
) -> tuple[int, list[Written]]:
    """One round of every way to write the events (in a rotating order), then the full export."""
    with Store.open(root, read_only=True) as st:
        n = st.con.execute("SELECT count(*) FROM events").fetchall()[0][0]

        def groups() -> None:
            export(st.con, work / "groups", only=["events"], events_per_file=per_file)

        def by_run() -> None:
            """One file per run, snappy: the layout the run groups are measured against."""
            st.con.execute("SET preserve_insertion_order = false")
            options = "FORMAT parquet, PARTITION_BY (run_id), COMPRESSION snappy"
            st.con.execute(f"COPY events TO '{work / 'by_run'}' ({options})")
            st.con.execute("SET preserve_insertion_order = true")

        def plain() -> None:
            st.con.execute(f"COPY events TO '{work / 'plain.parquet'}' (FORMAT parquet, COMPRESSION snappy)")

        jobs = {"groups": (groups, work / "groups"), "by_run": (by_run, work / "by_run")}
        jobs["plain"] = (plain, work / "plain.parquet")
        globs = {"groups": f"{work}/groups/events/*/*.parquet", "by_run": f"{work}/by_run/*/*.parquet"}
        names = list(jobs)
        for name in names[order % len(names) :] + names[: order % len(names)]:
            fn, path = jobs[name]
            ways[name].times.append(costed(fn))
            ways[name].bytes = tree_bytes(path)
            glob = globs.get(name, str(path))
            back = duckdb.execute(f"SELECT count(*) FROM read_parquet('{glob}')").fetchall()[0][0]
            assert back == n, (name, back, n)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        written, wall, cpu = spent(lambda: export(st.con, work / "full", events_per_file=per_file))
        ways["full"].times.append((wall, cpu))
        ways["full"].bytes = tree_bytes(work / "full")
        shutil.rmtree(work / "full")
    return n, written


def check_readback(root: Path, work: Path, per_file: int) -> None:
    """Every table of a full export read back: the same rows with the same values, both ways."""
    out = work / "check"
    with Store.open(root, read_only=True) as st:
        for w in export(st.con, out, events_per_file=per_file):
            if w.name == INDEX:
                continue
            cols = [r[0] for r in st.con.execute(f'DESCRIBE SELECT * FROM "{w.name}"').fetchall()]
            listed = ", ".join(f'"{c}"' for c in cols)
            src = f'SELECT {listed} FROM "{w.name}"'
            back = f"SELECT {listed} FROM {read_glob(out, w.name, w.partitioned)}"
            counts = [st.con.execute(f"SELECT count(*) FROM ({q})").fetchall()[0][0] for q in (src, back)]
            diffs = [
                st.con.execute(f"SELECT count(*) FROM ({a} EXCEPT ALL {b})").fetchall()[0][0]
                for a, b in ((src, back), (back, src))
            ]
            assert counts[0] == counts[1] == w.rows and diffs == [0, 0], (w, counts, diffs)
            print(f"  {w.name}: {w.rows:,} rows read back identical")
    shutil.rmtree(out)


def import_folders(tmp: Path, count: int) -> list[Path]:
    from tests.recorder.importers import amb_fixtures as fx

    first = fx.seg_local(tmp / "src", "kidney-seg", "kidney", tmp)
    return [first, *(shutil.copytree(first, first.parent / f"260412-{i:06x}") for i in range(1, count))]


def _parse_one(folder: Path) -> list:
    from tasks.registry import canonical_id

    return [automedbench.parse(folder, resolve_task=canonical_id)]


def import_round(folders: list[Path], store: Path) -> tuple[int, float, float]:
    """``amb import automedbench`` as the command runs it (threads, write, ingest): the events it
    imported, and its wall and CPU seconds."""
    from amb.imports import run_imports

    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    jobs = ((str(f), partial(_parse_one, f)) for f in folders)
    outcomes, wall, cpu = spent(lambda: run_imports(str(store), jobs, len(folders), "import"))
    assert all(o.status == "imported" for o in outcomes), outcomes[:3]
    return sum(int(o.detail.split()[0]) for o in outcomes), wall, cpu


def generate_round(store: Path, runs: int, events_per_run: int) -> float:
    """Baseline: the synthetic writer through the same spool path, about as many events, then ingest."""
    shutil.rmtree(store, ignore_errors=True)
    calls = max(1, round(events_per_run / 4))

    def generate() -> None:
        for i in range(runs):
            generate_run(store, f"g-{i:05d}", seed=i, calls=calls, sync=True)
        ingest(store)

    return timed(generate)[1]


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
    figs.write()


def parquet(root: Path, tmp: Path, args: argparse.Namespace, figs: figures.Figures) -> None:
    ways = {k: Measured() for k in ("groups", "by_run", "plain", "full")}
    n, written = 0, list[Written]()
    for i in range(args.rounds):
        n, written = parquet_round(root, tmp, args.events_per_file, ways, i)
    files = next(w.rows for w in written if w.name == INDEX)
    # The export is CPU-bound: on a shared machine its CPU seconds say more than its wall time.
    print("CPU seconds (medians): " + ", ".join(f"{k} {m.cpu():.2f}" for k, m in ways.items()))
    g, b, p = ways["groups"], ways["by_run"], ways["plain"]
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


def otel_export(events: list) -> int:
    """A run's OTLP line, made and dropped; its events."""
    line(events)
    return len(events)


def others(root: Path, tmp: Path, args: argparse.Namespace, figs: figures.Figures) -> None:
    with Store.open(root, read_only=True) as st:
        ids = run_ids(st.con)[:50]
        n_ev, dt = timed(lambda: sum(otel_export(list(iter_events(st.con, r))) for r in ids))
        figs.add(
            "otel", f"OpenTelemetry export of {len(ids)} runs ({n_ev:,} events)", f"{n_ev / dt:,.0f} events/s"
        )
        _, dt = timed(lambda: [export_run(st.con, st.blobs.get, r, tmp / "atif") for r in ids])
        figs.add(
            "atif",
            f"ATIF export of {len(ids)} runs (every request body read)",
            f"{len(ids) / dt:,.1f} runs/s",
        )
    folders = import_folders(tmp / "amb", args.folders)
    imp, gen = [], []
    for _ in range(args.rounds):
        events, wall, cpu = import_round(folders, tmp / "imported")
        imp.append((wall, cpu))
        gen.append(generate_round(tmp / "generated", len(folders), events // len(folders)))
    i, ic = (statistics.median(x) for x in zip(*imp, strict=True))
    g = statistics.median(gen)
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
