"""bench/ingest: ingest-with-verification vs DuckDB's own read_ndjson, on the same events.

Prints, for N events in R runs (default 1,000,000 in 1,000):
- ingest-with-verification rate (events/s) and its ratio to DuckDB's read_ndjson load of the same
  events into a plain table, measured in the same process (targets: ratio >= 0.5, >= 100k events/s).
  Both loads end with the database closed (data checkpointed to disk), both inputs are on disk and
  in the page cache before the first timing, and the two alternate for --rounds rounds (medians), so
  that background load and write-back fall on both sides alike;
- amb verify time over the whole store;
- the median time of an aggregate query (tokens per model per run; target < 1 s);
- bytes stored per event, with and without blob dedup.

With ``--against CHECKOUT`` (a previous build: ``git worktree add --detach ../prev COMMIT``), each
round also runs that build's ``amb ingest`` of the same spools in a child process (timed inside it,
the same way), and its rate and ratio are printed beside this build's.

Run: ./just bench ingest [--runs 1000] [--per-run 1000] [--rounds 3] [--keep DIR] [--against CHECKOUT]
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


from bench import figures
from bench.measure import costed, generate_runs, plain_load, read_through, repeat, timed, tree_bytes, workdir
from replay import spools
from replay.ingest import ingest, spool_files
from replay.store import Store
from replay.verify import verify
from schemas.blobstore import CHUNK_MAGIC
from schemas.frames import scan

AGGREGATE = """
SELECT run_id, model, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out, count(*) AS calls
FROM model_calls GROUP BY run_id, model ORDER BY run_id
"""


def write_ndjson(root: Path, out: Path) -> int:
    n = 0
    with open(out, "wb") as f:
        for path in spool_files(root):
            bodies = scan(path.read_bytes()).bodies
            for body in bodies:
                f.write(body)
                f.write(b"\n")
            n += len(bodies)
    return n


def amb_ingest(root: Path, total: int) -> float:
    """``amb ingest`` of every spool into a new store, timed up to the closed database."""
    for old in (root / "amb.duckdb", root / "amb.duckdb.wal"):
        old.unlink(missing_ok=True)
    # The spools stay as written here, so that every round loads the same files; what compressing
    # them after ingest (amb ingest's default) costs is measured once, after the rounds.
    report, elapsed = timed(lambda: ingest(root, spool_mode="keep"))
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
    if entry.codec != ord("c"):
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
    with workdir(args.keep, "amb-bench-ingest-") as work:
        measure(args, work, figs)
    figs.write()


def measure(args: argparse.Namespace, work: Path, figs: figures.Figures) -> None:
    root = work / "store"
    for old in (root / "amb.duckdb", root / "amb.duckdb.wal", work / "plain.duckdb", work / "events.ndjson"):
        old.unlink(missing_ok=True)
    if args.keep and (root / "spool").is_dir() and len(list((root / "spool").iterdir())) == args.runs:
        total, gen_s = sum(len(scan(p.read_bytes()).bodies) for p in spool_files(root)), 0.0
    else:
        if root.exists():
            shutil.rmtree(root)
        print(
            f"generating {args.runs} runs of ~{args.per_run} events (through the real spool writer)...",
            file=sys.stderr,
        )
        total, gen_s = timed(lambda: generate_runs(root, args.runs, args.per_run))

    ndjson = work / "events.ndjson"
    write_ndjson(root, ndjson)
    os.sync()  # flush pending writes, so that neither side pays for the other's I/O
    read_through([ndjson, *spool_files(root)])
    contenders: dict[str, Callable[[], tuple[float, float]]] = {
        "read_ndjson": lambda: costed(lambda: plain_load(ndjson, work / "plain.duckdb")),
        "amb ingest": lambda: costed(lambda: amb_ingest(root, total)),
    }
    if args.against:
        contenders["--against ingest"] = lambda: against_ingest(Path(args.against), root, total)
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    loads = []
    for i in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, run in contenders.items():
            w, c = run()
            wall[name].append(w)
            cpu[name].append(c)
        loads.append(os.getloadavg()[0])
        done = ", ".join(f"{n} {wall[n][-1]:.2f} s ({cpu[n][-1]:.1f} CPU s)" for n in contenders)
        print(f"  round {i + 1}/{args.rounds}: {done}, load {loads[-2]:.1f}-{loads[-1]:.1f}", file=sys.stderr)
    med_wall = {n: statistics.median(v) for n, v in wall.items()}
    med_cpu = {n: statistics.median(v) for n, v in cpu.items()}
    base_s, ingest_s = med_wall["read_ndjson"], med_wall["amb ingest"]

    with Store.open(root, read_only=True) as st:
        problems, verify_s = timed(lambda: verify(st.con, st.blobs))
        assert not problems, problems[:3]
        times = repeat(lambda: st.con.execute(AGGREGATE).fetchall(), 7)
        refs = st.con.execute(
            r"""SELECT unnest(regexp_extract_all(payload, '"blob":"(sha256:[0-9a-f]{64})"', 1)) FROM events"""
        ).fetchall()
        blob_sizes: dict[str, int] = {}
        no_dedup = 0
        for (blob,) in refs:
            size = blob_sizes.get(blob)
            if size is None:
                size = blob_sizes[blob] = stored_size(st.blobs, blob)
            no_dedup += size
    spool_bytes = sum(p.stat().st_size for p in spool_files(root))
    with Store.open(root) as st:
        settled, settle_s = timed(lambda: spools.settle(st, "compress"))
    packed_bytes = sum(p.stat().st_size for p in spool_files(root))
    if args.keep:  # put the spools back as written, for the next run to reuse
        for path in spool_files(root):
            if path.name.endswith(spools.COMPRESSED):
                path.with_name(path.name.removesuffix(spools.COMPRESSED)).write_bytes(spools.read_bytes(path))
                path.unlink()
    db_bytes = (root / "amb.duckdb").stat().st_size
    blob_bytes = tree_bytes(root / "blobs")

    ours = total / ingest_s
    theirs = total / base_s
    print(f"events                         {total:,} in {args.runs:,} runs (generated in {gen_s:.1f} s)")
    print(f"read_ndjson baseline           {base_s:.2f} s  {theirs:,.0f} events/s (median of {args.rounds})")
    print(f"amb ingest (with verification) {ingest_s:.2f} s  {ours:,.0f} events/s (median of {args.rounds})")
    print(
        f"ratio ingest / read_ndjson     {ours / theirs:.2f}   (target >= 0.5; rate target >= 100,000 "
        "events/s)"
    )

    def beside(name: str) -> str:
        """On a shared machine read_ndjson's wall time moves most (its close() waits on the disk), so
        besides the medians' ratio: the ratio in each round (the two loads side by side), the fastest
        rounds', and CPU's."""
        per_round = statistics.median(b / o for b, o in zip(wall["read_ndjson"], wall[name], strict=True))
        return (
            f"per round (median) {per_round:.2f}; fastest rounds "
            f"{min(wall['read_ndjson']) / min(wall[name]):.2f}; "
            f"CPU seconds {med_cpu['read_ndjson'] / med_cpu[name]:.2f}"
        )

    print(f"  same,                        {beside('amb ingest')}")
    print(
        f"CPU seconds (medians)          read_ndjson {med_cpu['read_ndjson']:.1f}, amb ingest "
        f"{med_cpu['amb ingest']:.1f}; load average {min(loads):.1f}-{max(loads):.1f} in the rounds"
    )
    against = ""
    if args.against:
        prev = total / med_wall["--against ingest"]
        print(
            f"--against {args.against}: amb ingest {med_wall['--against ingest']:.2f} s  {prev:,.0f} "
            f"events/s, ratio to read_ndjson {prev / theirs:.2f} ({beside('--against ingest')}; "
            f"CPU {med_cpu['--against ingest']:.1f} s); this build / that one: {ours / prev:.2f}x the rate"
        )
        against = f"; `--against` build: {prev:,.0f} events/s"
    print(f"amb verify (hashes, chains, manifests, {len(blob_sizes):,} blobs)  {verify_s:.2f} s")
    print(
        f"spools compressed after ingest {settle_s:.2f} s for {settled['compressed']:,} spools "
        f"({spool_bytes / 1e6:,.0f} MB -> {packed_bytes / 1e6:,.0f} MB; amb ingest's default, "
        "not in the rate above)"
    )
    aggregate_s = statistics.median(times)
    print(
        f"aggregate query median         {aggregate_s * 1000:.0f} ms   (tokens per model "
        "per run; target < 1 s)"
    )
    print(f"bytes per event, DuckDB only   {db_bytes / total:,.0f}")
    print(
        f"bytes per event, with blobs    {(db_bytes + blob_bytes) / total:,.0f} (blobs deduplicated "
        f"and chunked: {blob_bytes / 1e6:,.0f} MB)"
    )
    print(
        f"bytes per event, without dedup {(db_bytes + no_dedup) / total:,.0f} (each of the "
        f"{len(refs):,} references stored whole: {no_dedup / 1e6:,.0f} MB)"
    )
    figs.add(
        "rate",
        f"ingest with verification, {total:,} events in {args.runs:,} runs "
        "([reading it](docs/storage.md#amb-ingest))",
        f"**{ours:,.0f} events/s** ({ingest_s:.2f} s, CPU {med_cpu['amb ingest']:.1f} s), "
        f"median of {args.rounds}",
        f"DuckDB's `read_ndjson` of the same events: {theirs:,.0f} events/s; "
        f"**{ours / theirs:.2f}×**{against}",
        f"≥ 100,000 events/s ({figures.met(ours >= 100_000)}); ≥ 0.5× ({figures.met(ours >= theirs / 2)})",
    )
    figs.add("verify", f"`amb verify` of that store ({len(blob_sizes):,} blobs)", f"{verify_s:.1f} s")
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


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
