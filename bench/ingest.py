"""bench/ingest: ingest-with-verification vs DuckDB's own read_ndjson, on the same events.

For N events in R runs (default 1,000,000 in 1,000): the ingest rate beside DuckDB's ``read_ndjson``
load of the same events into a plain table, the two alternating for --rounds rounds (medians), both
timed up to a closed database on inputs in the page cache (how to read it: docs/storage.md, "What
the rate means"); ``amb verify`` of the store; the aggregate query; bytes stored per event, with and
without blob dedup. ``--against CHECKOUT`` also runs that build's ingest of the same spools in each
round, in a child process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench import figures, measure
from replay.ingest import ingest, spool_files
from replay.store import Store
from replay.verify import verify
from schemas import blobcodec
from schemas.blobstore import CHUNK_MAGIC


def amb_ingest(root: Path, total: int) -> float:
    """``amb ingest`` of every spool into a new store, timed up to the closed database."""
    for old in (root / "amb.duckdb", root / "amb.duckdb.wal"):
        old.unlink(missing_ok=True)
    # The spools stay as written, so that every round loads the same files.
    report, elapsed = measure.timed(lambda: ingest(root, spool_mode="keep"))
    assert report.events_added == total, (report.events_added, total)
    return elapsed


AGAINST = """
import inspect, resource, sys, time
from pathlib import Path
from replay.ingest import ingest
root = Path(sys.argv[1])
for old in (root / "amb.duckdb", root / "amb.duckdb.wal"):
    old.unlink(missing_ok=True)
# A build from before spools were settled after ingest keeps them as written anyway.
keep = {"spool_mode": "keep"} if "spool_mode" in inspect.signature(ingest).parameters else {}
t0 = time.perf_counter()
report = ingest(root, **keep)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t0, usage.ru_utime + usage.ru_stime, report.events_added)
"""
"""A previous build's ingest, timed like ``amb_ingest`` (its imports are done before the clock starts)."""


def against_ingest(checkout: Path, root: Path, total: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``checkout``'s ingest of the same spools, in a child process."""
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    out = subprocess.run(
        [sys.executable, "-c", AGAINST, str(root)], cwd=checkout, env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(f"ingest of {checkout} failed:\n{out.stderr}")
    wall, cpu, added = out.stdout.splitlines()[-1].split()  # (DuckDB may draw a progress bar first)
    assert int(added) == total, (added, total)
    return float(wall), float(cpu)


def stored_size(blobs, blob: str) -> int:
    """Bytes this blob would take stored on its own: its pack record, or its record plus all its chunks'."""
    hexd = blob[len("sha256:") :]
    entry = blobs.entry(hexd)
    assert entry is not None, blob
    if entry.codec != blobcodec.CHUNKS:
        return entry.length
    listing = bytes(blobs.read_record(hexd, entry)[1])
    chunks = listing[len(CHUNK_MAGIC) :].decode().split()
    return entry.length + sum(blobs.entry(c[len("sha256:") :]).length for c in chunks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--per-run", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="alternating baseline/ingest rounds (medians)")
    ap.add_argument("--keep", metavar="DIR", help="keep the generated spools and blobs here (reused later)")
    ap.add_argument(
        "--against", metavar="CHECKOUT", help="another build's checkout: its ingest runs in each round too"
    )
    figures.add_argument(ap, "ingest")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    with measure.workdir(args.keep, "amb-bench-ingest-") as work:
        run(args, work, figs)
    figs.write()


def run(args: argparse.Namespace, work: Path, figs: figures.Figures) -> None:
    root = work / "store"
    for old in (root / "amb.duckdb", root / "amb.duckdb.wal", work / "plain.duckdb", work / "events.ndjson"):
        old.unlink(missing_ok=True)
    if not (args.keep and (root / "spool").is_dir() and len(list((root / "spool").iterdir())) == args.runs):
        shutil.rmtree(root, ignore_errors=True)
        print(f"generating {args.runs} runs of ~{args.per_run} events...", file=sys.stderr)
        measure.generate_runs(root, args.runs, args.per_run)
    ndjson = work / "events.ndjson"
    total = measure.events_ndjson(root, ndjson)
    os.sync()  # flush pending writes, so that neither side pays for the other's I/O
    measure.read_through([ndjson, *spool_files(root)])
    contenders: dict[str, Callable[[], tuple[float, float]]] = {
        "read_ndjson": lambda: measure.costed(lambda: measure.plain_load(ndjson, work / "plain.duckdb")),
        "amb ingest": lambda: measure.costed(lambda: amb_ingest(root, total)),
    }
    if args.against:
        contenders["--against ingest"] = lambda: against_ingest(Path(args.against), root, total)
    rounds = measure.alternate(contenders, args.rounds)
    wall = {name: [w for w, _ in r] for name, r in rounds.items()}
    cpu = {name: statistics.median(c for _, c in r) for name, r in rounds.items()}
    ingest_s, base_s = statistics.median(wall["amb ingest"]), statistics.median(wall["read_ndjson"])

    def beside(name: str) -> str:
        """On a shared machine read_ndjson's wall time moves most (its close() waits on the disk), so
        besides the medians' ratio: the ratio in each round (the two loads side by side), the fastest
        rounds', and CPU's."""
        per_round = statistics.median(b / o for b, o in zip(wall["read_ndjson"], wall[name], strict=True))
        return (
            f"{name} / read_ndjson: per round (median) {per_round:.2f}; fastest rounds "
            f"{min(wall['read_ndjson']) / min(wall[name]):.2f}; "
            f"CPU seconds {cpu['read_ndjson'] / cpu[name]:.2f}"
        )

    with Store.open(root, read_only=True) as st:
        problems, verify_s = measure.timed(lambda: verify(st.con, st.blobs))
        assert not problems, problems[:3]
        aggregate = measure.repeat(lambda: st.con.execute(measure.AGGREGATE).fetchall(), 7)
        refs = [blob for (blob,) in st.con.execute(measure.BLOB_REFS).fetchall()]
        sizes = {blob: stored_size(st.blobs, blob) for blob in set(refs)}
    aggregate_s = statistics.median(aggregate)
    db_bytes, blob_bytes = (root / "amb.duckdb").stat().st_size, measure.tree_bytes(root / "blobs")
    no_dedup = sum(sizes[blob] for blob in refs)

    ours, theirs = total / ingest_s, total / base_s
    against = ""
    if args.against:
        against = f"; `--against` build: {total / statistics.median(wall['--against ingest']):,.0f} events/s"
    figs.add(
        "rate",
        f"ingest with verification, {total:,} events in {args.runs:,} runs "
        "([reading it](docs/storage.md#amb-ingest))",
        f"**{ours:,.0f} events/s** ({ingest_s:.2f} s, CPU {cpu['amb ingest']:.1f} s), "
        f"median of {args.rounds}",
        f"DuckDB's `read_ndjson` of the same events: {theirs:,.0f} events/s; "
        f"**{ours / theirs:.2f}×**{against}",
        f"≥ 100,000 events/s ({figures.met(ours >= 100_000)}); ≥ 0.5× ({figures.met(ours >= theirs / 2)})",
    )
    figs.add("verify", f"`amb verify` of that store ({len(sizes):,} blobs)", f"{verify_s:.1f} s")
    figs.add(
        "aggregate",
        "aggregate query (tokens per model per run) over those events",
        f"{aggregate_s * 1000:.0f} ms median",
        target=f"< 1 s ({figures.met(aggregate_s < 1)})",
    )
    figs.add(
        "bytes",
        "content bytes per event: DuckDB only / with blobs / with blobs, no dedup",
        " / ".join(f"{n / total:,.0f}" for n in (db_bytes, db_bytes + blob_bytes, db_bytes + no_dedup)),
    )
    for name in contenders:
        if name != "read_ndjson":
            print(beside(name))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
