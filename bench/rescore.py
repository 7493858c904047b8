"""Rescoring throughput: N synthetic runs scored with the offline judge and with a cached LLM judge.

Generates N synthetic runs through the real spool → ingest path (not timed), then times:

- baseline: reading every run's events back (``replay.read.iter_events``), the floor for any rescore;
- offline judge: ``score_runs`` over all runs (evidence, rules, codes, audit, cost, ledger append);
- LLM judge, cold: every item asked once of a loopback fake judge (fills the cache; not reported);
- LLM judge, cached: the same again, all verdicts from the cache (0 requests expected).

Memory: resident set size sampled after every chunk of 100 runs; "flat" means the RSS after the last
chunk is close to the RSS after the first. Target: 1,000 runs in under 60 s for the offline judge and
the cached LLM judge.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import figures
from bench.measure import peak_rss_mb, rss_mb, synthetic_store, timed, workdir
from replay.read import iter_events, run_ids
from scorer.batch import open_store, score_runs
from scorer.profile import load


def timed_score(st, profile, judge: str, jobs: int) -> tuple[float, list[float], int]:
    samples: list[float] = []
    result, dt = timed(
        lambda: score_runs(
            st, profile, judge=judge, jobs=jobs, keep_rows=False, progress=lambda n: samples.append(rss_mb())
        )
    )
    return dt, samples, result.judge_requests


def add_row(figs: figures.Figures, id: str, what: str, seconds: float, base: float, rss: list[float]) -> None:
    figs.add(
        id,
        what,
        f"{seconds:.1f} s; memory {rss[0]:.0f} MB after the first 100 runs, {rss[-1]:.0f} MB after the last",
        f"reading every run's events back: {base:.1f} s",
        f"< 60 s ({figures.met(seconds < 60)})",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=35, help="model calls per synthetic run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--store", default=None, metavar="DIR", help="reuse/keep this store (default: a temp dir)"
    )
    ap.add_argument("--skip-llm", action="store_true")
    figures.add_argument(ap, "rescore")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)

    with workdir(args.store, "amb-bench-rescore-") as work:
        run(args, work if args.store else work / "store", figs)
    figs.write()


def run(args: argparse.Namespace, store: Path, figs: figures.Figures) -> None:
    synthetic_store(store, args.runs, args.calls)
    profile = load("paper-2026-06")
    with open_store(store) as st:
        ids = run_ids(st.con)[: args.runs]
        _, base = timed(lambda: sum(1 for rid in ids for _ in iter_events(st.con, rid)))
        dt, rss, _ = timed_score(st, profile, "offline", args.jobs)
        add_row(figs, "offline", f"rescoring {len(ids):,} runs, offline judge", dt, base, rss)
        if not args.skip_llm:
            from tests.fakes import judge_server as fake

            with fake.JudgeServer(fake.default_policy, keep_requests=False) as server:
                os.environ["AMB_JUDGE_BASE_URL"] = server.base_url
                os.environ["AMB_JUDGE_MODEL"] = "fake-judge"
                timed_score(st, profile, "llm", max(args.jobs, 4))  # fills the cache
                dt, rss, n = timed_score(st, profile, "llm", args.jobs)
            print(f"LLM judge, cached: {n} requests to the judge", file=sys.stderr)
            what = f"rescoring {len(ids):,} runs, LLM judge, every verdict cached"
            add_row(figs, "llm-cached", what, dt, base, rss)
    print(f"peak RSS of this process: {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
