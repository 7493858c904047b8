"""Scanning throughput: one check over N synthetic runs as a Python scanner, as SQL, and as a cached
LLM scanner.

Generates N synthetic runs through the real spool → ingest path (not timed), then times:

- baseline: reading every run's events back and folding them (``iter_events`` + ``fold``), what any
  Python scanner pays;
- Python scanner: "the first shell a run started" over every run (``scorer.scan.scan``: read, fold,
  call, store the findings); target: at most 2x the baseline;
- SQL scanner: the same check as one query over the store; target: at least 10x faster than Python;
- LLM scanner, cached: a boolean question over every run, asked once of a loopback fake judge, then
  timed again with every verdict cached; target: 0 requests.

Each scanner is written anew with a unique comment, so every run of the bench is a new version that
scans every run (nothing is skipped).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import figures
from bench.measure import synthetic_store, timed, workdir
from replay.read import iter_events, run_ids
from replay.store import Store
from scorer import scan as scanning
from scorer import scanners
from scorer.profile import load
from scorer.trajectory import fold

PY = """# {tag}
from amb.scan import Finding, scanner


@scanner
def first_shell(traj):
    for i, p in traj.processes:
        if p.argv and p.argv[0].endswith("bash"):
            return Finding(value=True, explanation="a shell", events=[i])
    return None
"""

SQL = """-- {tag}
SELECT run_id, true AS value, 'a shell' AS explanation,
       list(source || ':' || seq ORDER BY ts_ns, seq)[1:1] AS events
FROM events WHERE kind = 'process.exited' AND payload->>'$.argv[0]' LIKE '%bash' GROUP BY run_id
"""

LLM = """name = "shell-{tag}"
prompt = "Did the agent start a shell?"
answer = "boolean"
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=1000, help="runs")
    ap.add_argument("--calls", type=int, default=35, help="model calls a run")
    ap.add_argument("--jobs", type=int, default=2, help="")
    ap.add_argument("--store", metavar="DIR", help="reuse/keep this store (default: a temp dir)")
    figures.add_argument(ap, "scan")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    with workdir(args.store, "amb-bench-scan-") as work:
        measure(args, work if args.store else work / "store", work, figs)
    figs.write()


def _scanner(work: Path, name: str, text: str) -> list[scanners.Scanner]:
    path = work / name
    path.write_text(text.format(tag=uuid.uuid4().hex))
    return scanners.load(str(path), model="fake-judge")


def measure(args: argparse.Namespace, store: Path, work: Path, figs: figures.Figures) -> None:
    _, setup = timed(lambda: synthetic_store(store, args.runs, args.calls))
    print(f"setup: {args.runs} runs generated and ingested in {setup:.1f} s")
    profile = load("paper-2026-06")
    with Store.open(store, read_only=True) as st:
        ids = run_ids(st.con)[: args.runs]
        _, base = timed(lambda: [fold(r, list(iter_events(st.con, r)), st.blobs.get) for r in ids])
    print(f"baseline (read back and fold every run): {base:.2f} s")
    py = _scanner(work, "first_shell.py", PY)
    (_, [t], _), dt_py = timed(lambda: scanning.scan(store, profile, py, runs=ids, jobs=args.jobs))
    sql = _scanner(work, "first_shell.sql", SQL)
    (_, [u], _), dt_sql = timed(lambda: scanning.scan(store, profile, sql, runs=ids, jobs=args.jobs))
    assert t.flagged == u.flagged, (t, u)
    print(f"python scanner: {dt_py:.2f} s ({dt_py / base:.2f}x the baseline); sql: {dt_sql:.3f} s")
    n = len(ids)
    figs.add(
        "python",
        f"a Python scanner over {n:,} runs ([docs/scanning.md](docs/scanning.md))",
        f"{dt_py:.1f} s",
        f"reading back and folding every run: {base:.1f} s ({dt_py / base:.2f}x)",
        f"≤ 2x ({figures.met(dt_py <= 2 * base)})",
    )
    figs.add(
        "sql",
        f"the same check as an SQL scanner over {n:,} runs",
        f"{dt_sql:.2f} s",
        f"the Python scanner: {dt_py:.1f} s ({dt_py / dt_sql:.0f}x faster)",
        f"≥ 10x faster ({figures.met(dt_py >= 10 * dt_sql)})",
    )
    from tests.fakes import judge_server as fake

    def yes(_req):
        return fake.Reply(content='{"value": true, "explanation": "a shell"}')

    with fake.JudgeServer(yes, keep_requests=False) as server:
        os.environ["AMB_JUDGE_BASE_URL"], os.environ["AMB_JUDGE_MODEL"] = server.base_url, "fake-judge"
        llm = _scanner(work, "shell.toml", LLM)
        _, cold = timed(lambda: scanning.scan(store, profile, llm, runs=ids, jobs=max(args.jobs, 4)))
        # Another name is another version, so no run is skipped; its prompt is the same, so every
        # question is answered from the cache.
        again = _scanner(work, "again.toml", LLM)
        (_, [w], asked), warm = timed(lambda: scanning.scan(store, profile, again, runs=ids, jobs=args.jobs))
    print(f"llm scanner: cold {cold:.1f} s; cached {warm:.2f} s, {asked} requests, {w.scanned} runs")
    figs.add(
        "llm-cached",
        f"an LLM scanner over {n:,} runs, every verdict cached",
        f"{warm:.1f} s, {asked} model requests",
        f"the first asking (loopback judge): {cold:.1f} s",
        f"0 requests ({figures.met(asked == 0 and w.errors == 0)})",
    )


if __name__ == "__main__":
    main()
