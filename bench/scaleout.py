"""bench/scaleout: what a sweep's executor and the shards' trip home cost.

- executor overhead per run: tiny runs swept by each executor, from dispatch to the shard in place,
  minus the run's own time (for ``slurm`` and ``ray``, unless ``SLURM_CONF`` or ``RAY_ADDRESS``
  names a cluster, the tests' real clusters are brought up);
- shard ingest rate: ``amb ingest --from`` of 1,000 shards beside plain ``amb ingest`` of the same
  runs, then the same load again (nothing added).

What each figure means and where the time goes: docs/scale-out.md, Measured.
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

from bench import figures
from bench.measure import percentile, timed
from recorder.synthetic import generate_run
from replay.ingest import ingest
from replay.shards import load_shards
from sweeps.collect import select
from sweeps.shard import Layout, ShardInfo, file_sizes, new_token, place, read_info
from sweeps.spec import Cell, run_id

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
    run_times = [read_info(layout.shard(c.final_run)).run_s for c in outcome.cells if c.final_run]
    return {
        "median": statistics.median(samples),
        "p90": percentile(samples, 90),
        # The cost per run with every slot kept busy: slot-seconds used beyond the runs' own time
        # (SLURM's gap between one task's end and the next one's start on a slot counts here).
        "slot": (outcome.wall_s * concurrency - sum(run_times)) / len(run_times),
        "run_s": statistics.fmean(run_times),
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
    layout = make_shards(tmp / "shards", n)
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
        f"median **{r['median']:.2f} s**, p90 {r['p90']:.2f} s; {r['slot']:.2f} s of slot time with every "
        f"slot busy{warm}",
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
    figures.add_argument(parser, "scaleout")
    args = parser.parse_args()
    figs = figures.Figures(parser, args)
    with tempfile.TemporaryDirectory(prefix="amb-bench-scaleout-") as tmpdir, contextlib.ExitStack() as stack:
        tmp = Path(tmpdir)
        for name in args.executors if args.only in (None, "overhead") else []:
            if name == "slurm" and not os.environ.get("SLURM_CONF"):
                from tests.clusters.slurm_cluster import SlurmCluster

                os.environ.update(stack.enter_context(SlurmCluster()).env)
            if name == "ray" and not os.environ.get("RAY_ADDRESS"):
                _ray_in_its_namespace(stack, args, tmp / "ray.json")
                figs.adopt(tmp / "ray.json")
                continue
            warm = {"warm": warm_exec_start(tmp)} if name == "local" else {}
            add_overhead(figs, name, overhead(name, args.runs, args.concurrency, tmp) | warm, args)
        if args.only in (None, "ingest"):
            ingest_rate(args.shards, tmp, figs)
        figs.write()


def _ray_in_its_namespace(stack: contextlib.ExitStack, args: argparse.Namespace, rows: Path) -> None:
    """The Ray measurement, in a child process inside the test cluster's network namespace (Ray
    would dial the machine's primary address from outside it), its figures written to ``rows``."""
    from tests.clusters.ray_cluster import RayCluster

    cluster = stack.enter_context(RayCluster(dashboard=False))
    options = ["--only", "overhead", "--executors", "ray", "--json", str(rows)]
    options += ["--runs", str(args.runs), "--concurrency", str(args.concurrency)]
    argv = [str(cluster.bin / "python"), __file__, *options]
    proc = subprocess.run(cluster.netns(argv), env=cluster.env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ray: the measurement failed:\n{proc.stderr[-3000:]}")


if __name__ == "__main__":
    main()
