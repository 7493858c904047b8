"""bench/storage: what a store takes on disk and how fast it reads, this build beside a previous one.

For each data set, each build (this checkout, and the one given with ``--against``) generates the
same synthetic runs through its own write path into its own store, ingests them with its own
``amb ingest`` (whatever it does with spools and blobs), and is then measured the same way:

- on-disk bytes per event: every file of the store (database, blob area, spools) by its allocated
  blocks (``st_blocks * 512``, what ``du`` counts), so the layout a build has is what is measured:
  loose blob files, pack files, compressed or dropped spools. Content bytes (file sizes) beside;
- blob read latency: a sample of the referenced blobs read back through the build's blob store,
  in a fresh process (p50, p99);
- ``amb verify`` time (every hash, chain, manifest and blob), with the page cache warm (the store
  just written) and cold (dropped just before: ``/proc/sys/vm/drop_caches``, root only; else
  reported as nan). Cold is what a verify meets on a store written days ago or on a cluster
  filesystem, where opening many small files is the cost;
- the aggregate query (tokens per model per run, over ``model_calls``): cold (the first query of a
  fresh process and connection) and warm (median of the next ten);
- ingest time and rate, and its ratio to DuckDB's own ``read_ndjson`` load of the same event
  bodies into a plain table (timed in the same run, before the build's ingest).

Every measurement of a build runs in its own process, with the build's packages first on the path
(as ``bench/proxy.py --against`` does), and the two builds alternate data set by data set.

Data sets: ``small``, 200 runs of 50 model calls (``amb generate --runs 200 --calls 50``, ~59k
events); ``ingest``, the 1,000-run set of ``bench/ingest.py`` (~1M events). ``--sets small`` runs
only the first.

Run: ./just bench storage [--against ../prev]... [--sets small,ingest] [--keep DIR]
     (each run generates its stores afresh: ingest compresses the spools it reads)
     (``git worktree add --detach ../prev main`` makes a previous build to compare with)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]

AGGREGATE = """
SELECT run_id, model, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out, count(*) AS calls
FROM model_calls GROUP BY run_id, model ORDER BY run_id
"""

SETS = {
    # name: (runs, generate_run keyword arguments)
    "tiny": (10, {"calls": 10}),  # a smoke test of the bench itself
    "small": (200, {"calls": 50}),
    "ingest": (1000, {"calls": 35, "processes_per_call": 26}),
}

# ---- the worker: runs inside a build's own process ------------------------------------------------


def _du(root: Path) -> tuple[int, int, dict[str, int]]:
    disk = content = 0
    areas: dict[str, int] = {}
    for dirpath, _, files in os.walk(root):
        st = os.lstat(dirpath)
        disk += st.st_blocks * 512
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            disk += st.st_blocks * 512
            content += st.st_size
            rel = Path(dirpath).relative_to(root).parts
            area = rel[0] if rel else name
            areas[area] = areas.get(area, 0) + st.st_blocks * 512
    return disk, content, areas


def work_generate(root: Path, runs: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    from recorder.synthetic import generate_run

    t0 = time.perf_counter()
    events = sum(generate_run(root, f"bench-{i:05d}", seed=i, **kwargs).events for i in range(runs))
    return {"events": events, "seconds": time.perf_counter() - t0}


def work_ingest(root: Path) -> dict[str, Any]:
    """``amb ingest`` as the build does it; a build that settles spools after ingest has the load
    and the settling timed apart (the load is what the ingest-rate target is about)."""
    import inspect

    from replay.ingest import ingest

    os.sync()
    settles = "spool_mode" in inspect.signature(ingest).parameters
    t0 = time.perf_counter()
    report = ingest(root, spool_mode="keep") if settles else ingest(root)
    seconds = time.perf_counter() - t0
    settle_s = 0.0
    if settles:
        from replay import spools
        from replay.store import Store

        with Store.open(root) as st:
            t0 = time.perf_counter()
            spools.settle(st, spools.mode())
            settle_s = time.perf_counter() - t0
    os.sync()
    disk, content, areas = _du(root)
    return {
        "seconds": seconds,
        "settle_s": settle_s,
        "events": report.events_added,
        "disk": disk,
        "content": content,
        "areas": areas,
    }


def work_ndjson(root: Path) -> dict[str, Any]:
    """DuckDB's own ``read_ndjson`` load of the same event bodies into a plain table (the ingest
    rate's yardstick, as in bench/ingest.py), from the spools as written, before any ingest."""
    import duckdb

    work = Path(tempfile.mkdtemp(prefix="amb-bench-ndjson-"))
    try:
        ndjson, n = work / "events.ndjson", 0
        with open(ndjson, "wb") as out:
            for spool in sorted(root.glob("spool/*/*.spool")):
                lines = spool.read_bytes().split(b"\n")[1:]  # the first is the spool's magic
                for line in lines:
                    if line:
                        out.write(line.split(b"\t", 2)[2] + b"\n")
                        n += 1
        os.sync()
        times = []
        for _ in range(3):  # the median of three: one load under a noisy machine says little
            (work / "plain.duckdb").unlink(missing_ok=True)
            t0 = time.perf_counter()
            con = duckdb.connect(str(work / "plain.duckdb"))
            con.execute(
                """CREATE TABLE plain AS SELECT * FROM read_ndjson(?, columns = {
                       kind: 'VARCHAR', payload: 'JSON', prev_hash: 'VARCHAR', run_id: 'VARCHAR',
                       seq: 'BIGINT', source: 'VARCHAR', ts_ns: 'BIGINT', v: 'INTEGER'})""",
                [str(ndjson)],
            )
            con.close()
            times.append(time.perf_counter() - t0)
        return {"seconds": statistics.median(times), "events": n}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def work_verify(root: Path) -> dict[str, Any]:
    from replay.store import Store
    from replay.verify import verify

    with Store.open(root, read_only=True) as st:
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        problems = verify(st.con, st.blobs)
        seconds = time.perf_counter() - t0
        cpu = _cpu_seconds() - cpu0
    return {"seconds": seconds, "cpu_s": cpu, "problems": len(problems)}


def _cpu_seconds() -> float:
    """User and system CPU time of this process and of its children that have ended (a build's
    verify may run part of its work in a child process). On a shared machine the wall time of a
    CPU-bound step mostly says how busy the others were; its CPU time says what it cost."""
    import resource

    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def work_query(root: Path) -> dict[str, Any]:
    from replay.store import open_sql

    t0 = time.perf_counter()
    con = open_sql(root)
    con.execute(AGGREGATE).fetchall()
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(10):
        t0 = time.perf_counter()
        con.execute(AGGREGATE).fetchall()
        warm.append(time.perf_counter() - t0)
    return {"cold_s": cold, "warm_s": statistics.median(warm)}


def work_blobs(root: Path, sample: int) -> dict[str, Any]:
    import random

    from replay.store import Store

    with Store.open(root, read_only=True) as st:
        refs = [
            r[0]
            for r in st.con.execute(
                r"""SELECT DISTINCT unnest(regexp_extract_all(payload, '"blob":"(sha256:[0-9a-f]{64})"', 1))
                    FROM events ORDER BY 1"""
            ).fetchall()
        ]
        picked = random.Random(0).sample(refs, min(sample, len(refs)))
        times = []
        for ref in picked:
            t0 = time.perf_counter()
            st.blobs.get(ref)
            times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "n": len(times),
        "p50_ms": times[len(times) // 2] * 1000,
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1000,
    }


def worker(argv: list[str]) -> None:
    what, root = argv[0], Path(argv[1])
    if what == "generate":
        out = work_generate(root, int(argv[2]), json.loads(argv[3]))
    elif what == "ingest":
        out = work_ingest(root)
    elif what == "verify":
        out = work_verify(root)
    elif what == "ndjson":
        out = work_ndjson(root)
    elif what == "query":
        out = work_query(root)
    elif what == "blobs":
        out = work_blobs(root, int(argv[2]))
    else:
        raise SystemExit(f"unknown worker step {what}")
    print(json.dumps(out))


# ---- the driver ----------------------------------------------------------------------------------


def drop_page_cache() -> bool:
    """Write back and drop the kernel's page cache (needs root), so that the next step reads the
    store (and Python's own files) from the disk. False if this machine does not let us."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def warm_page_cache(store: Path) -> None:
    """Read every file of the store once, so that a warm measurement does not follow a drop."""
    from bench.measure import read_through

    read_through(sorted(store.rglob("*")))


def cold_verify(build: Path, store: Path) -> dict[str, Any] | None:
    """``amb verify`` in a fresh process right after the page cache is dropped (None if it cannot be)."""
    if not drop_page_cache():
        return None
    out = run_step(build, "verify", str(store))
    if out["problems"]:
        raise SystemExit(f"bench: {build}: amb verify found {out['problems']} problems")
    return out


def run_step(build: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(build), "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", *args],
        env=env,
        cwd=build,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench: step {args[0]} of {build} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(build: Path, store: Path, runs: int, kwargs: dict[str, Any], sample: int) -> dict[str, Any]:
    shutil.rmtree(store, ignore_errors=True)
    print(f"  {build}: generating {runs} runs...", file=sys.stderr)
    gen = run_step(build, "generate", str(store), str(runs), json.dumps(kwargs))
    print(f"  {build}: {gen['events']:,} events in {gen['seconds']:.0f} s", file=sys.stderr)
    before_disk, before_content, _ = _du(store)
    ndjson = run_step(HERE, "ndjson", str(store))  # DuckDB's, the same whatever the build
    ingest = run_step(build, "ingest", str(store))
    verify = run_step(build, "verify", str(store))
    if verify["problems"]:
        raise SystemExit(f"bench: {build}: amb verify found {verify['problems']} problems")
    cold = cold_verify(build, store)
    warm_page_cache(store)  # the steps below are measured warm, as before the cold row existed
    query = run_step(build, "query", str(store))
    blobs = run_step(build, "blobs", str(store), str(sample))
    n = ingest["events"]
    return {
        "events": n,
        "before_ingest_disk_per_event": before_disk / n,
        "disk_per_event": ingest["disk"] / n,
        "content_per_event": ingest["content"] / n,
        "areas_per_event": {k: v / n for k, v in sorted(ingest["areas"].items())},
        "ingest_s": ingest["seconds"],
        "ingest_rate": n / ingest["seconds"],
        "ndjson_rate": ndjson["events"] / ndjson["seconds"],
        "ingest_vs_ndjson": (n / ingest["seconds"]) / (ndjson["events"] / ndjson["seconds"]),
        "settle_s": ingest["settle_s"],
        "verify_s": verify["seconds"],
        "verify_cpu_s": verify["cpu_s"],
        "verify_cold_s": cold["seconds"] if cold else float("nan"),
        "blob_p50_ms": blobs["p50_ms"],
        "blob_p99_ms": blobs["p99_ms"],
        "query_cold_ms": query["cold_s"] * 1000,
        "query_warm_ms": query["warm_s"] * 1000,
    }


ROWS = [
    ("on-disk bytes/event after ingest (du)", "disk_per_event", "{:,.0f}"),
    ("content bytes/event (file sizes)", "content_per_event", "{:,.0f}"),
    ("on-disk bytes/event before ingest", "before_ingest_disk_per_event", "{:,.0f}"),
    ("ingest time (s)", "ingest_s", "{:.2f}"),
    ("ingest rate (events/s)", "ingest_rate", "{:,.0f}"),
    ("read_ndjson of the same events (events/s)", "ndjson_rate", "{:,.0f}"),
    ("ingest rate / read_ndjson rate", "ingest_vs_ndjson", "{:.2f}"),
    ("spools compressed/dropped after ingest (s)", "settle_s", "{:.2f}"),
    ("amb verify (s)", "verify_s", "{:.2f}"),
    ("amb verify CPU, user + system (s)", "verify_cpu_s", "{:.2f}"),
    ("amb verify, page cache dropped (s)", "verify_cold_s", "{:.2f}"),
    ("blob read p50 (ms)", "blob_p50_ms", "{:.3f}"),
    ("blob read p99 (ms)", "blob_p99_ms", "{:.3f}"),
    ("aggregate query cold (ms)", "query_cold_ms", "{:.1f}"),
    ("aggregate query warm (ms)", "query_warm_ms", "{:.1f}"),
]


def report(name: str, results: dict[str, dict[str, Any]]) -> None:
    builds = list(results)
    first = results[builds[0]]
    others = builds[1:]
    print(f"\n{name}: {first['events']:,} events  (load average {os.getloadavg()[0]:.1f})")
    header = f"{'':44}" + "".join(f"{b:>16}" for b in builds) + "".join(f"{'this/' + b:>18}" for b in others)
    print(header)
    for label, key, fmt in ROWS:
        cells = "".join(f"{fmt.format(results[b][key]):>16}" for b in builds)
        ratios = "".join(
            f"{(first[key] / results[b][key]) if results[b][key] else float('nan'):>17.2f}x" for b in others
        )
        print(f"{label:44}{cells}{ratios}")
    for b in builds:
        areas = ", ".join(f"{k} {v:,.0f}" for k, v in results[b]["areas_per_event"].items())
        print(f"  {b}: on-disk bytes/event by area: {areas}")


DESCRIBED = {
    "tiny": "10 runs × 10 calls",
    "small": "200 runs × 50 calls",
    "ingest": "1,000 runs of `bench/ingest.py`",
}


def by_area(result: dict[str, Any]) -> str:
    areas = result["areas_per_event"]
    database = sum(v for k, v in areas.items() if k.startswith("amb.duckdb"))
    blobs, spools = areas.get("blobs", 0), areas.get("spool", 0)
    return f"database {database:,.0f}, blobs {blobs:,.0f}, spools {spools:,.0f}"


def add_figures(figs: Any, name: str, results: dict[str, dict[str, Any]], names: dict[str, str]) -> None:
    """The README's rows for one data set: this build, beside the first ``--against`` build if any."""
    from bench.figures import NONE, met

    ours = results["this"]
    other = next((label for label in results if label != "this"), None)

    def beside(text: Callable[[dict[str, Any]], str]) -> str:
        return NONE if other is None else f"{names[other]}: {text(results[other])}"

    def verify_beside(key: str) -> tuple[str, float] | None:
        return None if other is None else (names[other], results[other][key])

    per_event = ours["disk_per_event"]
    figs.add(
        f"{name}-bytes",
        f"store on disk, {DESCRIBED[name]} ({ours['events']:,} events) "
        "([where the bytes are](docs/storage.md#where-the-bytes-are))",
        f"**{per_event:,.0f} bytes per event** ({by_area(ours)})",
        beside(lambda r: f"{r['disk_per_event']:,.0f} ({per_event / r['disk_per_event']:.2f}×)"),
        f"≤ 600 ({met(per_event <= 600)})",
    )
    figs.add(
        f"{name}-ingest",
        "ingest of that store beside DuckDB's `read_ndjson` of its events",
        f"{ours['ingest_vs_ndjson']:.2f}× `read_ndjson`'s rate ({ours['ingest_rate']:,.0f} events/s)",
        beside(lambda r: f"{r['ingest_vs_ndjson']:.2f}×"),
        f"≥ 0.5× ({met(ours['ingest_vs_ndjson'] >= 0.5)})",
    )
    add_verify(figs, name, "warm", ours["verify_s"], ours["verify_cpu_s"], verify_beside("verify_s"))
    if ours["verify_cold_s"] == ours["verify_cold_s"]:  # not NaN: the page cache could be dropped
        add_verify(figs, name, "cold", ours["verify_cold_s"], None, verify_beside("verify_cold_s"))
    figs.add(
        f"{name}-aggregate",
        "aggregate query (tokens per model per run) on that store, warm / cold",
        f"**{ours['query_warm_ms']:.1f} ms** / {ours['query_cold_ms']:.0f} ms",
        beside(lambda r: f"{r['query_warm_ms']:.1f} / {r['query_cold_ms']:.0f} ms"),
        f"warm ≤ 10 ms ({met(ours['query_warm_ms'] <= 10)})",
    )
    figs.add(
        f"{name}-blob-read",
        "a blob read on that store (random referenced blobs), p50 / p99",
        f"{ours['blob_p50_ms']:.3f} / {ours['blob_p99_ms']:.2f} ms",
        beside(lambda r: f"{r['blob_p50_ms']:.3f} / {r['blob_p99_ms']:.2f} ms"),
    )


def add_verify(
    figs: Any,
    name: str,
    cache: str,
    seconds: float,
    cpu: float | None,
    theirs: tuple[str, float] | None,
    rounds: int = 1,
) -> None:
    """The row of one ``amb verify`` figure, beside ``theirs`` (the other build's name and seconds)."""
    from bench.figures import NONE, faster

    what = "page cache warm" if cache == "warm" else "page cache dropped first (needs root)"
    figs.add(
        f"{name}-verify-{cache}",
        f"`amb verify` of that store, {what}",
        f"**{seconds:.2f} s**"
        + (f" (CPU {cpu:.2f} s)" if cpu is not None else "")
        + (f", median of {rounds} alternating rounds" if rounds > 1 else ""),
        NONE if theirs is None else f"{theirs[0]}: {theirs[1]:.2f} s ({faster(seconds, theirs[1])})",
    )


def verify_again(
    builds: dict[str, Path], work: Path, sets: list[str], rounds: int, figs: Any, names: dict[str, str]
) -> None:
    """``amb verify`` of each build on its own kept store, builds alternating round by round: with
    the page cache warm, then (where it can be dropped) cold."""
    for name in sets:
        times: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        loads = []
        for _ in range(rounds):
            for label, build in builds.items():
                store = work / f"{name}-{label}"
                warm_page_cache(store)  # the round before dropped it
                warm = run_step(build, "verify", str(store))
                if warm["problems"]:
                    raise SystemExit(f"bench: {label}: amb verify found {warm['problems']} problems")
                for cache, out in (("warm", warm), ("cold", cold_verify(build, store))):
                    if out is not None:
                        times.setdefault((cache, label), []).append(out["seconds"])
                        cpu.setdefault((cache, label), []).append(out["cpu_s"])
                loads.append(os.getloadavg()[0])
        for cache in ("warm", "cold"):
            if (cache, "this") not in times:
                print(f"\n{name}: amb verify, page cache dropped: not measured (needs root)")
                continue
            first = statistics.median(times[(cache, "this")])
            first_cpu = statistics.median(cpu[(cache, "this")])
            what = "page cache warm" if cache == "warm" else "page cache dropped before each"
            print(
                f"\n{name}: amb verify ({what}), median of {rounds} alternating rounds "
                f"(load average {min(loads):.1f}-{max(loads):.1f})"
            )
            for label in builds:
                ts, med_cpu = times[(cache, label)], statistics.median(cpu[(cache, label)])
                med = statistics.median(ts)
                rounds_s = ", ".join(f"{t:.2f}" for t in ts)
                print(
                    f"  {label:16} {med:8.2f} s   (rounds {rounds_s})   this/{label} {first / med:.2f}x"
                    f"   CPU {med_cpu:.2f} s, this/{label} {first_cpu / med_cpu:.2f}x"
                )
            other = next((label for label in builds if label != "this"), None)
            theirs = None if other is None else (names[other], statistics.median(times[(cache, other)]))
            add_verify(figs, name, cache, first, first_cpu, theirs, rounds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--against",
        type=Path,
        action="append",
        default=[],
        metavar="CHECKOUT",
        help="a checkout of another build to measure beside this one (may be given more than once)",
    )
    ap.add_argument("--sets", default="small,ingest", help="data sets: small (200 runs), ingest (1,000 runs)")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep the measured stores in this directory")
    ap.add_argument("--blob-sample", type=int, default=2000)
    ap.add_argument(
        "--verify-again",
        type=int,
        metavar="ROUNDS",
        help="only time amb verify again on the stores a run with --keep left, builds alternating",
    )
    sys.path.insert(0, str(HERE))
    from bench import figures

    figures.add_argument(ap, "storage")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    builds = {"this": HERE}
    for against in args.against:
        if not (against / "replay" / "ingest.py").is_file():
            raise SystemExit(f"bench: {against} is not a checkout of this project (no replay/ingest.py)")
        builds[against.resolve().name] = against.resolve()
    names = {label: figures.build_name(path) for label, path in builds.items()}
    if args.verify_again:
        if args.keep is None:
            raise SystemExit("bench: --verify-again needs --keep DIR (the stores of an earlier run)")
        verify_again(builds, args.keep, args.sets.split(","), int(args.verify_again), figs, names)
        figs.write()
        return
    work = args.keep or Path(tempfile.mkdtemp(prefix="amb-bench-storage-"))
    try:
        for name in args.sets.split(","):
            if name not in SETS:
                raise SystemExit(f"bench: unknown data set {name!r} (small, ingest)")
            runs, kwargs = SETS[name]
            results = {}
            for label, build in builds.items():
                store = work / f"{name}-{label}"
                results[label] = measure(build, store, runs, kwargs, args.blob_sample)
            report(name, results)
            add_figures(figs, name, results, names)
        figs.write()
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.insert(0, os.environ.get("PYTHONPATH", str(HERE)))
        worker(sys.argv[2:])
    else:
        main()
