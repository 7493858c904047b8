"""bench/scaleout: what a sweep's executor and the shards' trip home cost.

Prints:
- **executor overhead per run**: 40 tiny runs (the agent is ``true``, local backend, recorded under
  the shim) swept by each executor; per run, the time from its dispatch (the executor started its
  ``amb sweep exec``) to its shard being complete (renamed into ``shards/``), minus the run's own
  time (``shard.json``'s ``run_s``: the exec's call of the recorder, from its imports and proxy start
  to the closed run). What remains is the executor's and the exec's own cost: starting (local, Ray:
  forking from a warm ``amb sweep exec --serve``; SLURM: a new interpreter importing amb), reading
  the spec, sealing and renaming the shard. Median, p90 and mean; for local also the warm exec's
  own start, paid once per sweep.
  Targets: under 1 s on local and Ray, under 2 s on SLURM. ``--executors local slurm ray``: for
  ``slurm`` (unless ``SLURM_CONF`` names a cluster) and ``ray`` (unless ``RAY_ADDRESS`` does) the
  benchmark brings up the tests' real clusters (tests/clusters/: a controller with two compute
  nodes; a Ray head and a worker in a loopback-only network namespace, where the Ray measurement
  runs in a child process of this benchmark).
- **shard ingest rate**: 1,000 shards of synthetic runs (the real spool writer and blob store,
  2 model calls each) loaded into an empty store by ``amb ingest --from`` (every shard checked:
  layout, sizes, frames, envelopes, blobs; then one bulk ingest), beside the baseline of the same
  runs' spools already in the store loaded by plain ``amb ingest``; then the same load again
  (idempotent: nothing copied, nothing added). Target: at least 50 shards/s.

Run: ./just bench scaleout [--runs 40] [--shards 1000] [--executors local] [--only overhead|ingest]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench import figures  # noqa: E402 - after the path set-up above
from bench.measure import timed  # noqa: E402
from recorder.synthetic import generate_run  # noqa: E402
from replay.ingest import ingest  # noqa: E402
from replay.shards import load_shards  # noqa: E402
from sweeps.collect import select  # noqa: E402
from sweeps.shard import Layout, ShardInfo, file_sizes, new_token, place, read_info  # noqa: E402
from sweeps.spec import Cell, run_id  # noqa: E402

SWEEP = """
name = "bench"
tasks = ["bccd-det"]
tiers = ["lite"]
repeats = {runs}
concurrency = {concurrency}
time_limit_s = 60
backend = "local"
cases = 1

[[agents]]
name = "tiny"
command = ["true"]

[executor]
name = "{executor}"
"""


def overhead(executor: str, runs: int, concurrency: int, tmp: Path) -> dict[str, float]:
    """Sweep ``runs`` tiny runs with ``executor``; per-run overhead figures in seconds."""
    from sweeps.driver import run_sweep
    from sweeps.plan import load_sweep

    sweep_file = tmp / f"{executor}.toml"
    sweep_file.write_text(SWEEP.format(runs=runs, concurrency=concurrency, executor=executor))
    spec = load_sweep(sweep_file, work=tmp / f"work-{executor}")
    with open(os.devnull, "w") as quiet:
        outcome = run_sweep(spec, tmp / f"store-{executor}", out=quiet)
    layout = Layout(spec.work)
    dispatch = outcome.dispatch or {}
    samples = []
    for cell in outcome.cells:
        rid = cell.final_run
        if rid is None or rid not in dispatch:
            continue
        shard = layout.shard(rid)
        complete = os.stat(shard).st_ctime_ns / 1e9  # the rename into shards/ sets it
        samples.append(complete - dispatch[rid] - read_info(shard).run_s)
    if len(samples) < runs:
        raise SystemExit(f"{executor}: only {len(samples)} of {runs} runs have a shard and a dispatch time")
    samples.sort()
    run_times = [read_info(layout.shard(c.final_run)).run_s for c in outcome.cells if c.final_run]
    return {
        "median": statistics.median(samples),
        "p90": samples[int(0.9 * (len(samples) - 1))],
        "mean": statistics.fmean(samples),
        "wall": outcome.wall_s,
        # The cost per run with every slot kept busy: slot-seconds used beyond the runs' own time
        # (SLURM's gap between one task's end and the next one's start on a slot counts here).
        "slot": (outcome.wall_s * concurrency - sum(run_times)) / len(run_times),
        "run_s": statistics.fmean(
            read_info(layout.shard(c.final_run)).run_s for c in outcome.cells if c.final_run
        ),
    }


def warm_exec_start(tmp: Path) -> float:
    """Seconds from starting ``amb sweep exec --serve`` to its imports done: what the local executor
    (and each Ray worker) pays once, not per run."""
    from sweeps.forkserver import ExecServer

    server = ExecServer(tmp / "warm-exec.log")
    try:
        ready = server.wait_ready()
    finally:
        server.close()
    if ready is None:
        raise SystemExit(f"the warm exec did not start: {(tmp / 'warm-exec.log').read_text()[-2000:]}")
    return ready


def make_shards(root: Path, n: int) -> Layout:
    layout = Layout(root)
    layout.make()
    for i in range(n):
        cell = Cell("bench", "synthetic", "bccd-det", "lite", i + 1)
        rid = run_id(cell, 1)
        token = new_token()
        attempt_dir = layout.attempts / rid / token
        attempt_dir.mkdir(parents=True)
        generate_run(attempt_dir, rid, seed=i, calls=2)
        info = ShardInfo(
            run_id=rid,
            cell=cell.key,
            attempt=1,
            status="completed",
            exit_code=0,
            host="bench",
            pid=os.getpid(),
            token=token,
            started_ns=0,
            ended_ns=0,
            run_s=0.0,
            gpu_ids=[],
            cpus=None,
            memory=None,
            files=file_sizes(attempt_dir),
        )
        place(layout, attempt_dir, info)
    return layout


def ingest_rate(n: int, tmp: Path, figs: figures.Figures) -> None:
    layout, made_s = timed(lambda: make_shards(tmp / "shards", n))
    print(f"  made {n} shards in {made_s:.1f}s")
    sel = select(layout)
    assert len(sel.take) == n, len(sel.take)

    # Baseline: the same spools and blobs already inside a store, loaded by plain ingest.
    base = tmp / "store-base"
    for shard, rid in sel.take:
        shutil.copytree(shard / "spool" / rid, base / "spool" / rid)
        shutil.copytree(shard / "blobs", base / "blobs", dirs_exist_ok=True)
    plain, t_plain = timed(lambda: ingest(base))
    report, t_shards = timed(lambda: load_shards(tmp / "store", select(layout).take))
    assert len(report.loaded) == n and not report.refused, report.refused
    assert report.ingest is not None and report.ingest.events_added == plain.events_added

    again, t_again = timed(lambda: load_shards(tmp / "store", select(layout).take))
    assert again.ingest is not None and again.ingest.events_added == 0

    print(f"  amb ingest --from (checked):   {t_shards:6.2f}s  {n / t_shards:7.1f} shards/s  (target >= 50)")
    print(
        f"  plain ingest (baseline):       {t_plain:6.2f}s  {n / t_plain:7.1f} runs/s   "
        f"ratio {t_shards / t_plain:.2f}x"
    )
    print(f"  again (idempotent, no change): {t_again:6.2f}s  {n / t_again:7.1f} shards/s")
    print(f"  events: {plain.events_added}")
    figs.add(
        "shard-ingest",
        f"`amb ingest --from` of {n:,} shards (each checked, then one bulk ingest)",
        f"**{n / t_shards:.1f} shards/s** ({t_shards:.1f} s); "
        f"again: {n / t_again:.0f} shards/s, nothing added",
        f"plain `amb ingest` of the same runs: {n / t_plain:.1f} runs/s "
        f"(`--from` {figures.faster(t_shards, t_plain)})",
        f"≥ 50 shards/s ({figures.met(n / t_shards >= 50)})",
    )


TARGET_S = {"local": 1.0, "ray": 1.0, "slurm": 2.0}
"""The most a run may cost each executor beyond its own time."""


def add_overhead(figs: figures.Figures, name: str, r: dict[str, float], args: argparse.Namespace) -> None:
    warm = f"; its warm exec starts in {r['warm']:.1f} s, once per sweep" if "warm" in r else ""
    figs.add(
        f"overhead-{name}",
        f"sweep executor overhead per run, {name}: {args.runs} tiny runs, concurrency {args.concurrency} "
        "([what it is](docs/scale-out.md#measured))",
        f"median **{r['median']:.2f} s**, p90 {r['p90']:.2f} s{warm}",
        f"the run's own time: {r['run_s']:.2f} s",
        f"< {TARGET_S[name]:.0f} s ({figures.met(r['median'] < TARGET_S[name])})",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--executors", nargs="+", default=["local"])
    parser.add_argument("--only", choices=["overhead", "ingest"], default=None)
    parser.add_argument("--quiet-header", action="store_true", help=argparse.SUPPRESS)
    figures.add_argument(parser, "scaleout")
    args = parser.parse_args()
    figs = figures.Figures(parser, args)
    if not args.quiet_header:
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="amb-bench-scaleout-") as tmpdir, contextlib.ExitStack() as stack:
        tmp = Path(tmpdir)
        if args.only in (None, "overhead"):
            if not args.quiet_header:
                print(f"executor overhead per run ({args.runs} tiny runs, concurrency {args.concurrency}):")
            for name in args.executors:
                if name == "slurm" and not os.environ.get("SLURM_CONF"):
                    from tests.clusters.slurm_cluster import SlurmCluster

                    os.environ.update(stack.enter_context(SlurmCluster()).env)
                if name == "ray" and not os.environ.get("RAY_ADDRESS"):
                    _ray_in_its_namespace(stack, args, tmp / "ray.json")
                    figs.adopt(tmp / "ray.json")
                    continue
                warm = None
                if name == "local":
                    warm = warm_exec_start(tmp)
                    print(f"  local  warm exec ready in {warm:.2f}s (once per sweep)")
                r = overhead(name, args.runs, args.concurrency, tmp)
                add_overhead(figs, name, r if warm is None else {**r, "warm": warm}, args)
                print(
                    f"  {name:6s} median {r['median']:.3f}s  p90 {r['p90']:.3f}s  mean {r['mean']:.3f}s "
                    f"(run's own time {r['run_s']:.2f}s; sweep wall {r['wall']:.1f}s; "
                    f"per run with {args.concurrency} slots busy {r['slot']:.2f}s)"
                )
        if args.only in (None, "ingest"):
            print(f"shard ingest ({args.shards} shards):")
            ingest_rate(args.shards, tmp, figs)
        figs.write()
    if not args.quiet_header:
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _ray_in_its_namespace(stack: contextlib.ExitStack, args: argparse.Namespace, rows: Path) -> None:
    """The Ray measurement, in a child process inside the test cluster's network namespace (Ray
    would dial the machine's primary address from outside it), its figures written to ``rows``."""
    from tests.clusters.ray_cluster import RayCluster

    cluster = stack.enter_context(RayCluster(dashboard=False))
    argv = [
        str(cluster.bin / "python"),
        __file__,
        "--only",
        "overhead",
        "--executors",
        "ray",
        "--quiet-header",
        "--json",
        str(rows),
    ]
    argv += ["--runs", str(args.runs), "--concurrency", str(args.concurrency)]
    proc = subprocess.run(cluster.netns(argv), env=cluster.env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ray: the measurement failed:\n{proc.stderr[-3000:]}")
    print(proc.stdout, end="")


if __name__ == "__main__":
    main()
