"""bench/storage: what a store takes on disk and how fast it reads, this build beside a previous one.

For each data set, each build (this checkout, and those given with ``--against``) generates the
same synthetic runs through its own write path, ingests them with its own ``amb ingest``, and is
measured the same way, each step in a process of its own with the build's packages first on the
path: bytes on disk per event, blob read latency, ``amb verify`` warm and cold, the aggregate query
cold and warm, and the ingest rate beside DuckDB's ``read_ndjson``. The data sets, the measures and
how to read them: docs/storage.md (``./just bench storage``).

Run: ./just bench storage [--against ../prev]... [--sets small,ingest] [--keep DIR]
     (each run generates its stores afresh: ingest compresses the spools it reads)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

# This checkout's harness, also in a worker measuring another build (imported before that build's
# packages go first on the path).
from bench import figures, measure
from bench.figures import NONE, faster, met

SETS = {
    # name: (runs, generate_run keyword arguments, as a row describes the set)
    "tiny": (10, {"calls": 10}, "10 runs × 10 calls"),  # a smoke test of the bench itself
    "small": (200, {"calls": 50}, "200 runs × 50 calls"),
    "ingest": (1000, {"calls": 35, "processes_per_call": 26}, "1,000 runs of `bench/ingest.py`"),
}

# ---- the worker: runs inside a build's own process ------------------------------------------------


def work_generate(root: Path, runs: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    from recorder.synthetic import generate_run

    return {"events": sum(generate_run(root, f"bench-{i:05d}", seed=i, **kwargs).events for i in range(runs))}


def work_ingest(root: Path) -> dict[str, Any]:
    """``amb ingest`` as the build does it; a build that settles spools after ingest has the load
    and the settling timed apart (the load is what the ingest-rate target is about)."""
    import inspect

    from replay.ingest import ingest

    os.sync()
    settles = "spool_mode" in inspect.signature(ingest).parameters
    report, seconds = measure.timed(lambda: ingest(root, spool_mode="keep") if settles else ingest(root))
    if settles:
        from replay import spools
        from replay.store import Store

        with Store.open(root) as st:
            spools.settle(st, spools.mode())
    os.sync()
    return {"seconds": seconds, "events": report.events_added}


def work_ndjson(root: Path) -> dict[str, Any]:
    """DuckDB's own ``read_ndjson`` load of the same event bodies into a plain table (the ingest
    rate's yardstick, as in bench/ingest.py), from the spools as written, before any ingest."""
    with measure.workdir(None, "amb-bench-ndjson-") as work:
        n = measure.events_ndjson(root, work / "events.ndjson")
        os.sync()
        # The median of three: one load under a noisy machine says little.
        times = [measure.plain_load(work / "events.ndjson", work / "plain.duckdb") for _ in range(3)]
    return {"seconds": statistics.median(times), "events": n}


def work_verify(root: Path) -> dict[str, Any]:
    from replay.store import Store
    from replay.verify import verify

    with Store.open(root, read_only=True) as st:
        cpu0 = measure.cpu_seconds(children=True)  # a build's verify may work in a child process
        problems, seconds = measure.timed(lambda: verify(st.con, st.blobs))
        cpu = measure.cpu_seconds(children=True) - cpu0
    return {"seconds": seconds, "cpu_s": cpu, "problems": len(problems)}


def work_query(root: Path) -> dict[str, Any]:
    from replay.store import open_sql

    con, opened = measure.timed(lambda: open_sql(root))
    _, cold = measure.timed(lambda: con.execute(measure.AGGREGATE).fetchall())
    warm = measure.repeat(lambda: con.execute(measure.AGGREGATE).fetchall(), 10)
    return {"cold_s": opened + cold, "warm_s": statistics.median(warm)}


def work_blobs(root: Path, sample: int) -> dict[str, Any]:
    import random

    from replay.store import Store

    with Store.open(root, read_only=True) as st:
        refs = sorted({r[0] for r in st.con.execute(measure.BLOB_REFS).fetchall()})
        picked = random.Random(0).sample(refs, min(sample, len(refs)))
        times = [measure.timed(partial(st.blobs.get, ref))[1] * 1000 for ref in picked]
    return {"p50_ms": measure.percentile(times, 50), "p99_ms": measure.percentile(times, 99)}


WORK: dict[str, Callable[..., dict[str, Any]]] = {
    "generate": work_generate,
    "ingest": work_ingest,
    "ndjson": work_ndjson,
    "verify": work_verify,
    "query": work_query,
    "blobs": work_blobs,
}


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


def verified(build: Path, store: Path) -> dict[str, Any]:
    """``amb verify`` of ``store`` by ``build``, in a fresh process; an error if it found problems."""
    out = run_step(build, "verify", store)
    if out["problems"]:
        raise SystemExit(f"bench: {build}: amb verify found {out['problems']} problems")
    return out


def cold_verify(build: Path, store: Path) -> dict[str, Any] | None:
    """``amb verify`` right after the page cache is dropped (None if it cannot be)."""
    return verified(build, store) if drop_page_cache() else None


def run_step(build: Path, what: str, store: Path, *extra: object) -> dict[str, Any]:
    """A worker step in a process of its own, ``build``'s packages first on its path."""
    env = {**os.environ, "PYTHONPATH": str(build), "PYTHONHASHSEED": "0"}
    argv = [sys.executable, __file__, "--worker", what, str(store), *map(json.dumps, extra)]
    done = subprocess.run(argv, env=env, cwd=build, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench: step {what} of {build} failed:\n{done.stderr[-3000:]}")
    return cast(dict[str, Any], json.loads(done.stdout.strip().splitlines()[-1]))


def measured(build: Path, store: Path, runs: int, kwargs: dict[str, Any], sample: int) -> dict[str, Any]:
    shutil.rmtree(store, ignore_errors=True)
    print(f"  {build}: generating {runs} runs...", file=sys.stderr)
    run_step(build, "generate", store, runs, kwargs)
    ndjson = run_step(HERE, "ndjson", store)  # DuckDB's, the same whatever the build
    ingest = run_step(build, "ingest", store)
    verify = verified(build, store)
    cold = cold_verify(build, store)
    measure.read_through(sorted(store.rglob("*")))  # the steps below are measured warm
    query = run_step(build, "query", store)
    blobs = run_step(build, "blobs", store, sample)
    n = ingest["events"]
    areas = {p.name: measure.disk_bytes(p) for p in store.iterdir()}  # database, blobs, spools
    return {
        "events": n,
        "disk_per_event": sum(areas.values()) / n,
        "areas_per_event": {k: v / n for k, v in sorted(areas.items())},
        "ingest_rate": n / ingest["seconds"],
        "ingest_vs_ndjson": (n / ingest["seconds"]) / (ndjson["events"] / ndjson["seconds"]),
        "verify_s": verify["seconds"],
        "verify_cpu_s": verify["cpu_s"],
        "verify_cold_s": cold["seconds"] if cold else float("nan"),
        "blob_p50_ms": blobs["p50_ms"],
        "blob_p99_ms": blobs["p99_ms"],
        "query_cold_ms": query["cold_s"] * 1000,
        "query_warm_ms": query["warm_s"] * 1000,
    }


def by_area(result: dict[str, Any]) -> str:
    areas = result["areas_per_event"]
    database = sum(v for k, v in areas.items() if k.startswith("amb.duckdb"))
    blobs, spools = areas.get("blobs", 0), areas.get("spool", 0)
    return f"database {database:,.0f}, blobs {blobs:,.0f}, spools {spools:,.0f}"


def add_figures(figs: Any, name: str, results: dict[str, dict[str, Any]], names: dict[str, str]) -> None:
    """The README's rows for one data set: this build, beside the first ``--against`` build if any."""
    ours = results["this"]
    other = next((label for label in results if label != "this"), None)

    def beside(text: Callable[[dict[str, Any]], str]) -> str:
        return NONE if other is None else f"{names[other]}: {text(results[other])}"

    def verify_beside(key: str) -> tuple[str, float] | None:
        return None if other is None else (names[other], results[other][key])

    per_event = ours["disk_per_event"]
    figs.add(
        f"{name}-bytes",
        f"store on disk, {SETS[name][2]} ({ours['events']:,} events) "
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
        for _ in range(rounds):
            for label, build in builds.items():
                store = work / f"{name}-{label}"
                measure.read_through(sorted(store.rglob("*")))  # the round before dropped it
                for cache, out in (("warm", verified(build, store)), ("cold", cold_verify(build, store))):
                    if out is not None:
                        times.setdefault((cache, label), []).append(out["seconds"])
                        cpu.setdefault((cache, label), []).append(out["cpu_s"])
        other = next((label for label in builds if label != "this"), None)
        for cache in ("warm", "cold"):
            if (cache, "this") not in times:
                print(f"{name}: amb verify, page cache dropped: not measured (needs root)", file=sys.stderr)
                continue
            theirs = None if other is None else (names[other], statistics.median(times[(cache, other)]))
            ours = statistics.median(times[(cache, "this")])
            add_verify(figs, name, cache, ours, statistics.median(cpu[(cache, "this")]), theirs, rounds)


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
    ap.add_argument(
        "--sets", default="small,ingest", help="data sets: small (200 runs), ingest (1,000 runs), tiny (10)"
    )
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep the measured stores in this directory")
    ap.add_argument("--blob-sample", type=int, default=2000)
    ap.add_argument(
        "--verify-again",
        type=int,
        metavar="ROUNDS",
        help="only time amb verify again on the stores a run with --keep left, builds alternating",
    )
    figures.add_argument(ap, "storage")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    builds = {"this": HERE}
    for against in args.against:
        if not (against / "replay" / "ingest.py").is_file():
            raise SystemExit(f"bench: {against} is not a checkout of this project (no replay/ingest.py)")
        builds[against.resolve().name] = against.resolve()
    names = {label: figures.build_name(path) for label, path in builds.items()}
    sets = args.sets.split(",")
    unknown = set(sets) - set(SETS)
    if unknown:
        raise SystemExit(f"bench: unknown data set {', '.join(sorted(unknown))} (known: {', '.join(SETS)})")
    if args.verify_again:
        if args.keep is None:
            raise SystemExit("bench: --verify-again needs --keep DIR (the stores of an earlier run)")
        verify_again(builds, args.keep, sets, int(args.verify_again), figs, names)
    else:
        with measure.workdir(args.keep, "amb-bench-storage-") as work:
            for name in sets:
                runs, kwargs, _ = SETS[name]
                results = {
                    label: measured(build, work / f"{name}-{label}", runs, kwargs, args.blob_sample)
                    for label, build in builds.items()
                }
                add_figures(figs, name, results, names)
    figs.write()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.insert(0, os.environ["PYTHONPATH"])  # the measured build's packages
        what, root, *extra = sys.argv[2:]
        print(json.dumps(WORK[what](Path(root), *map(json.loads, extra))))
    else:
        main()
