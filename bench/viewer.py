"""bench/viewer: the viewer's API pages, a run page's first paint, and the diff of two big runs.

On a store with 1,000 runs, one run of about 100,000 events and two runs of about 10,000 events
(built once and kept in --store, default out/bench-viewer-store), prints:

- for each API page: median time over --repeat requests through the HTTP server, and its size
  (targets: < 100 ms median, < 200 KB), beside a baseline measured in the same process: what a
  viewer without paging would do for the same view (every event of the run, or the runs view
  aggregated again for every page);
- the payload search of the 100k run (replay.search's pattern) beside lowering every payload, CPU;
- the diff of the two 10k-event runs: the first (uncached) /api/diff answer (target < 1 s), and
  the alignment alone;
- the first paint of a run page in headless Chromium (Playwright, /usr/bin/chromium) with
  ``amb serve`` in its own process, opened by a deep link in the middle of the 100k-event run in a
  fresh page: when the client saw the linked event marked, and when the page painted it (its own
  Element Timing), target < 1 s, beside a one-line page in the same browser; with --against, another
  checkout's viewer alternating with this one.

Run: ./just bench viewer [--store DIR] [--rebuild] [--repeat 15] [--only api|paint] [--against CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench import figures, measure
from bench.measure import process_cpu_seconds
from recorder.synthetic import generate_run
from replay import search
from replay.ingest import ingest
from replay.web import diff as diffs
from replay.web.server import Running
from tests.replay.viewer_store import CHROMIUM, chromium_flags

BIG, DIFF_A, DIFF_B = "big-100k", "diff-10k-a", "diff-10k-b"


def build(root: Path, runs: int) -> None:
    t0 = time.perf_counter()
    for i in range(runs):
        generate_run(root, f"run-{i:05d}", seed=i, calls=35)
        if i % 100 == 99:
            print(f"  generated {i + 1}/{runs} runs ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    generate_run(root, BIG, seed=7, calls=100, processes_per_call=1010)
    generate_run(root, DIFF_A, seed=3, calls=250, processes_per_call=38)
    generate_run(root, DIFF_B, seed=8, calls=250, processes_per_call=38)
    print(f"  generated in {time.perf_counter() - t0:.0f} s; ingesting", file=sys.stderr)
    ingest(root)


def fetch(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
        assert r.status == 200, url
    return time.perf_counter() - t0, len(body)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=120) as r:
        return json.loads(r.read())


def median_s(fn: Callable[[], object], times: int) -> float:
    return statistics.median(measure.repeat(fn, times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", metavar="DIR", default="out/bench-viewer-store")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument(
        "--only", choices=["api", "paint"], help="measure the API pages (and diff) or the first paint"
    )
    ap.add_argument(
        "--against",
        type=Path,
        metavar="CHECKOUT",
        help="another checkout of amb (e.g. an export of main): its viewer's first paint beside this one's",
    )
    figures.add_argument(ap, "viewer")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    root = Path(args.store)
    if args.rebuild and root.exists():
        shutil.rmtree(root)
    if not (root / "amb.duckdb").exists():
        print(f"building the store in {root} (once)", file=sys.stderr)
        build(root, args.runs)
    if args.only != "paint":
        api_pages(root, args.repeat, figs)
    if args.only != "api":
        first_paint(root, args.repeat, args.against, figs)
    figs.write()


def api_pages(root: Path, repeat: int, figs: figures.Figures) -> None:
    with Running(root) as viewer:
        base = viewer.url
        first_runs = fetch(base + "/api/runs")[0]  # builds the run index once
        page1 = get_json(base + "/api/runs?limit=50")
        around = get_json(f"{base}/api/runs/{BIG}/events?around=shim:50000")
        call = get_json(f"{base}/api/runs/{BIG}/events?kinds=model_call.completed&limit=60")["events"][20]
        n_runs, n_big = page1["total"], get_json(f"{base}/api/runs/{BIG}")["n_events"]
        tl = get_json(f"{base}/api/runs/{BIG}/timeline")
        mid = tl["to_ms"] / 2
        pages = {
            "runs list": "/api/runs",
            "runs list, filtered and sorted": "/api/runs?task=vqa-rad&tier=lite&sort=tokens&order=asc",
            "runs list, next page": f"/api/runs?cursor={page1['next']}",
            "runs list, search": "/api/runs?q=claude",
            "run summary (100k)": f"/api/runs/{BIG}",
            "events, first page (100k)": f"/api/runs/{BIG}/events",
            "events around a deep link (100k)": f"/api/runs/{BIG}/events?around=shim:50000",
            "events, next page (100k)": f"/api/runs/{BIG}/events?after={around['next']}",
            "events, one kind (100k)": f"/api/runs/{BIG}/events?kinds=model_call.completed",
            "events, search in payloads (100k)": f"/api/runs/{BIG}/events?q=sys.exit(1)",
            "timeline, whole run (100k)": f"/api/runs/{BIG}/timeline",
            "timeline, zoomed (100k)": f"/api/runs/{BIG}/timeline?from_ms={mid}&to_ms={mid + 300_000}",
            "model call on expand (100k)": f"/api/runs/{BIG}/calls/{call['source']}/{call['seq']}",
            "one event (100k)": f"/api/runs/{BIG}/events/shim/50000",
            "grid of one task": "/api/grid?task=vqa-rad",
        }
        print(f"first /api/runs (builds the index): {first_runs * 1000:.0f} ms", file=sys.stderr)
        medians, largest = {}, 0
        for name, path in pages.items():
            times, sizes = zip(*(fetch(base + path) for _ in range(repeat)), strict=True)
            medians[name], largest = statistics.median(times) * 1000, max(largest, *sizes)
        worst = max(medians.values())

        # Baselines in the same process: what a viewer without paging or an index would do.
        # (The server's own read-only connection: DuckDB allows one configuration per file and process.)
        with viewer.viewer.reader.cursor() as con:
            all_events = median_s(
                lambda: con.execute(
                    "SELECT source, seq, ts_ns, kind, CAST(payload AS VARCHAR) FROM events WHERE run_id = ? "
                    "ORDER BY ts_ns, source, seq",
                    [BIG],
                ).fetchall(),
                3,
            )
            searches = search_baseline(con, repeat)
            a, b = diffs.load_steps(con, DIFF_A), diffs.load_steps(con, DIFF_B)
            n_a = con.execute("SELECT count(*) FROM events WHERE run_id = ?", [DIFF_A]).fetchall()[0][0]
            n_b = con.execute("SELECT count(*) FROM events WHERE run_id = ?", [DIFF_B]).fetchall()[0][0]
        align = median_s(lambda: diffs.align(a, b), 3)
        t_diff, size_diff = fetch(f"{base}/api/diff?a={DIFF_A}&b={DIFF_B}")
        t_diff2, _ = fetch(f"{base}/api/diff?a={DIFF_A}&b={DIFF_B}")
    slowest = max(medians, key=medians.__getitem__)
    figs.add(
        "api",
        f"viewer API pages, {n_runs:,} runs with one of {n_big:,} events, medians of {repeat} "
        "([benchmark](docs/viewer.md#benchmark))",
        f"{min(medians.values()):.1f}–{worst:.1f} ms (slowest: {slowest}), at most {largest / 1024:.1f} KB",
        f"the whole 100k run in one answer: {all_events * 1000:.0f} ms",
        f"< 100 ms, < 200 KB ({figures.met(worst < 100 and largest < 200_000)})",
    )
    cpu, lowering = searches
    figs.add(
        "search",
        f"payload search in the run of {n_big:,} events, CPU, median of {repeat}",
        f"{cpu:.0f} ms",
        f"lowering every payload: {lowering:.0f} ms ({cpu / lowering:.2f}×)",
    )
    figs.add(
        "diff",
        f"diff of two runs of {n_a:,} and {n_b:,} events, first answer",
        f"**{t_diff * 1000:.0f} ms** ({size_diff / 1024:.0f} KB); cached {t_diff2 * 1000:.0f} ms",
        f"their alignment alone: {align * 1000:.0f} ms",
        f"< 1 s ({figures.met(t_diff < 1)})",
    )


def search_baseline(con: Any, repeat: int) -> tuple[float, float]:
    """The payload search of the 100k run as the viewer runs it (replay.search: one pattern, no
    lowering) beside the naive search that lowers every payload at each search, alternating: the
    median CPU ms of each."""
    q = "SYS.exit(1)"
    sql = "SELECT source, seq FROM events WHERE run_id = ? AND kind NOT IN ('file.accessed') AND "
    condition, arg = search.matches(con, q)
    ways = {"pattern": (sql + condition, arg), "lowering every payload": (sql + search.FALLBACK, q)}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    answers = {}
    for _ in range(repeat):
        for name, (query, value) in ways.items():
            c0 = time.process_time()
            answers[name] = sorted(con.execute(query, [BIG, value]).fetchall())
            cpu[name].append((time.process_time() - c0) * 1000)
    assert answers["pattern"] == answers["lowering every payload"], "the two searches differ"
    return statistics.median(cpu["pattern"]), statistics.median(cpu["lowering every payload"])


# Marks the deep-linked row for the browser's Element Timing as soon as it enters the page (a
# mutation observer runs before the next paint), so the page reports when that row was painted.
MARK_TARGET = """
new MutationObserver(() => {
  const row = document.querySelector('.ev.target');
  if (row && !row.dataset.timed) {
    row.dataset.timed = '1';
    for (const span of row.querySelectorAll('span')) span.setAttribute('elementtiming', 'target');
  }
}).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ['class'] });
"""
PAINTED = """() => new Promise((done) => {
  const seen = [];
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) if (e.identifier === 'target') seen.push(e.renderTime || e.loadTime);
    if (seen.length) done(Math.min(...seen));
  }).observe({ type: 'element', buffered: true });
  setTimeout(() => done(null), 5000);
})"""
TIMING = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const res = performance.getEntriesByType('resource');
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  const api = res.filter((r) => r.name.includes('/events?'));
  const before = api.length ? api[0].startTime : null;
  return {
    html: nav.responseEnd, scripts: nav.domInteractive, fcp: fcp ? fcp.startTime : null,
    events_sent: before, events_done: api.length ? api[0].responseEnd : null,
    bytes_before: res.filter((r) => before === null || r.startTime < before)
      .reduce((n, r) => n + r.encodedBodySize, nav.encodedBodySize),
    requests_before: res.filter((r) => before === null || r.startTime < before).length + 1,
  };
}"""


class Serve:
    """``amb serve`` in its own process, as a person runs it (the bench's client stays apart from it),
    from this checkout or from another one (``--against``)."""

    def __init__(self, root: Path, checkout: Path | None = None):
        env = dict(os.environ)
        cwd = None
        if checkout is not None:
            env["PYTHONPATH"] = str(checkout)
            cwd = str(checkout)
        code = "import sys; from amb.main import cli; sys.exit(cli())"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "serve", "--store", str(root.resolve()), "--port", "0"],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
        if not found:
            self.proc.kill()
            raise SystemExit(f"amb serve did not start: {line}")
        self.url = found.group(1)

    def cpu_s(self) -> float:
        return process_cpu_seconds(self.proc.pid) or 0.0

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def first_paint(root: Path, repeat: int, against: Path | None, figs: figures.Figures) -> None:
    """A deep link into the middle of the 100k run, opened in a fresh page each time: how long until
    Chromium painted the linked row, beside a one-line page in the same browser; with ``against``,
    that checkout's viewer on the same store, alternating with this one."""
    from playwright.sync_api import sync_playwright

    servers = {"this checkout": Serve(root)}
    if against is not None:
        servers[f"against {against}"] = Serve(root, against)
    try:
        for s in servers.values():  # the run index is built once per server, before any timing
            fetch(s.url + "/api/runs")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_flags())
            # Baseline in the same browser: a page that paints one line and fetches nothing.
            blank = []
            for _ in range(repeat):
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                t0 = time.perf_counter()
                page.goto(f"{servers['this checkout'].url}/static/app.css", wait_until="commit")
                page.set_content("<p id=x>x</p>")
                page.wait_for_selector("#x", timeout=30_000)
                blank.append(time.perf_counter() - t0)
                page.close()
            got: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
            for i in range(repeat):
                key = f"shim:{40000 + 997 * i}"
                for name, s in servers.items():
                    page = browser.new_page(viewport={"width": 1300, "height": 900})
                    page.add_init_script(MARK_TARGET)
                    c0 = s.cpu_s()
                    t0 = time.perf_counter()
                    page.goto(f"{s.url}/runs/{BIG}#{key}", wait_until="commit")
                    page.wait_for_selector(f"[id='ev-{key}'].target", timeout=30_000)
                    wall = time.perf_counter() - t0
                    painted = page.evaluate(PAINTED)
                    timing = page.evaluate(TIMING)
                    # Everything else the page asks for, after the paint, before the server's CPU is read.
                    page.wait_for_load_state("networkidle")
                    got[name].append(
                        {
                            "wall": wall * 1000,
                            "painted": painted or float("nan"),
                            **timing,
                            "cpu": (s.cpu_s() - c0) * 1000,
                        }
                    )
                    page.close()
            browser.close()
    finally:
        for s in servers.values():
            s.close()
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731 - a bench one-liner
    for name, rows in got.items():
        print(
            f"{name}: medians from navigation start: page answered {med(rows, 'html'):.0f} ms, "
            f"its script ran {med(rows, 'scripts'):.0f} ms, first paint {med(rows, 'fcp'):.0f} ms, "
            f"events asked {med(rows, 'events_sent'):.0f} ms and answered {med(rows, 'events_done'):.0f} ms, "
            f"linked row painted {med(rows, 'painted'):.0f} ms; before the events request: "
            f"{rows[0]['requests_before']} requests, {rows[0]['bytes_before'] / 1024:.1f} KB"
        )
    ours = got["this checkout"]
    other = ""
    if against is not None:
        other = f"; {figures.build_name(against)}: painted {med(got[f'against {against}'], 'painted'):.0f} ms"
    figs.add(
        "paint",
        f"first paint of a run page at a deep link into the 100k run (Chromium, {repeat} fresh pages)",
        f"seen at **{med(ours, 'wall'):.0f} ms** (max {max(r['wall'] for r in ours):.0f}), painted at "
        f"{med(ours, 'painted'):.0f} ms; server CPU {med(ours, 'cpu'):.0f} ms",
        f"a one-line page: {statistics.median(blank) * 1000:.0f} ms{other}",
        f"< 1 s ({figures.met(med(ours, 'wall') < 1000)})",
    )


if __name__ == "__main__":
    main()
