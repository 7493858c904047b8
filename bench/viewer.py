"""bench/viewer: the viewer's API pages, a run page's first paint, and the diff of two big runs.

On a store with 1,000 runs, one of about 100,000 events and two of about 10,000 (built once and
kept in --store), with ``amb serve`` in its own process: every API page beside the whole run in one
answer, the payload search beside lowering every payload, a fresh server's runs list and diff, and
a deep link's first paint in headless Chromium. ``--against CHECKOUT`` measures that checkout's
viewer in the same rounds, the two builds taking turns. What each figure means and how to read it:
docs/viewer.md#benchmark.
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
from collections.abc import Callable, Iterator
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench import figures, measure
from bench.measure import process_cpu_seconds
from recorder.synthetic import generate_run
from replay import search
from replay.ingest import ingest
from replay.store import open_sql
from replay.web import diff as diffs
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


class Build(NamedTuple):
    """One build of the viewer under measure: its name in the rows, its store and its checkout (None:
    this one)."""

    name: str
    store: Path
    checkout: Path | None = None


THIS = "this build"


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
        help="another checkout of amb (with its .venv): its viewer measured in the same rounds as this one",
    )
    ap.add_argument(
        "--against-store",
        type=Path,
        metavar="DIR",
        help="the store --against serves, built by that checkout's own bench (default: --store)",
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
    builds = [Build(THIS, root)]
    if args.against is not None:
        other = args.against_store or root
        if not (other / "amb.duckdb").exists():
            raise SystemExit(f"bench: no store in {other}: build one with that checkout's bench/viewer.py")
        builds.append(Build(figures.build_name(args.against), other, args.against))
    if args.only != "paint":
        api_pages(builds, args.repeat, figs)
        fresh_servers(builds, args.repeat, figs)
    if args.only != "api":
        first_paint(builds, args.repeat, figs)
    figs.write()


def pages_of(base: str) -> dict[str, str]:
    """The API pages the bench measures, each a path on the server at ``base`` (the cursors and the
    expanded call are taken from that server's own answers)."""
    page1 = get_json(base + "/api/runs?limit=50")
    around = get_json(f"{base}/api/runs/{BIG}/events?around=shim:50000")
    call = get_json(f"{base}/api/runs/{BIG}/events?kinds=model_call.completed&limit=60")["events"][20]
    mid = get_json(f"{base}/api/runs/{BIG}/timeline")["to_ms"] / 2
    # (a store of 50 runs or fewer has no second page to measure)
    second = {"runs list, next page": f"/api/runs?cursor={page1['next']}"} if page1["next"] else {}
    return {
        "runs list": "/api/runs",
        "runs list, filtered and sorted": "/api/runs?task=vqa-rad&tier=lite&sort=tokens&order=asc",
        **second,
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


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def beside(builds: list[Build], ours: float, theirs: dict[str, float], shown: dict[str, str]) -> str:
    """The other build's figure (``shown[name]``) and how ours compares with its time, or ``—``."""
    if len(builds) < 2:
        return figures.NONE
    name = builds[1].name
    return f"{name}: {shown[name]} ({figures.faster(ours, theirs[name], 2)})"


def api_pages(builds: list[Build], repeat: int, figs: figures.Figures) -> None:
    """Every API page, each build's server asked in turn, ``repeat`` rounds per page; a row per page,
    and one for the whole 100k run in one answer (this build's store, the bench's own connection)."""
    servers = {b.name: Serve(b.store, b.checkout) for b in builds}
    try:
        for name, s in servers.items():
            t = fetch(s.url + "/api/runs")[0]  # builds the run index once
            print(f"{name}: first /api/runs (builds the index): {t * 1000:.0f} ms", file=sys.stderr)
        paths = {name: pages_of(s.url) for name, s in servers.items()}
        n_runs = get_json(servers[THIS].url + "/api/runs?limit=1")["total"]
        got: dict[str, dict[str, list[tuple[float, int, float]]]] = {}
        for page in paths[THIS]:
            got[page] = measure.alternate(
                {n: partial(servers[n].get, paths[n][page]) for n in servers},
                repeat,
                rotate=True,
            )
    finally:
        for s in servers.values():
            s.close()
    ms = {p: {n: statistics.median(r[0] for r in rs) * 1000 for n, rs in by.items()} for p, by in got.items()}
    kb = {p: {n: max(r[1] for r in rs) / 1024 for n, rs in by.items()} for p, by in got.items()}
    cpu = {p: {n: statistics.mean(r[2] for r in rs) * 1000 for n, rs in by.items()} for p, by in got.items()}
    shown = {
        p: {n: f"{ms[p][n]:.1f} ms, {kb[p][n]:.1f} KB, CPU {cpu[p][n]:.0f} ms" for n in ms[p]} for p in ms
    }
    for page in got:
        ours, size = ms[page][THIS], kb[page][THIS]
        figs.add(
            f"api-{slug(page)}",
            f"viewer API: {page}, {n_runs:,} runs, median of {repeat} (CPU: the server's mean)",
            shown[page][THIS].replace(f"{ours:.1f} ms", f"**{ours:.1f} ms**", 1),
            beside(builds, ours, ms[page], shown[page]),
            f"< 100 ms, < 200 KB ({figures.met(ours < 100 and size < 200)})",
        )
    with closing(open_sql(builds[0].store)) as con:
        n_big = con.execute("SELECT count(*) FROM events WHERE run_id = ?", [BIG]).fetchall()[0][0]
        all_events = median_s(
            lambda: con.execute(
                "SELECT source, seq, ts_ns, kind, CAST(payload AS VARCHAR) FROM events WHERE run_id = ? "
                "ORDER BY ts_ns, source, seq",
                [BIG],
            ).fetchall(),
            3,
        )
        search_cpu, lowering = search_baseline(con, repeat)
    worst = max(ms, key=lambda p: ms[p][THIS])
    figs.add(
        "api",
        f"viewer API pages, {n_runs:,} runs with one of {n_big:,} events "
        "([benchmark](docs/viewer.md#benchmark))",
        f"slowest {ms[worst][THIS]:.1f} ms ({worst}), largest {max(k[THIS] for k in kb.values()):.1f} KB",
        f"the whole 100k run in one answer: {all_events * 1000:.0f} ms",
    )
    figs.add(
        "search",
        f"payload search in the run of {n_big:,} events, CPU, median of {repeat}",
        f"{search_cpu:.0f} ms",
        f"lowering every payload: {lowering:.0f} ms ({search_cpu / lowering:.2f}×)",
    )


def fresh_server(b: Build) -> dict[str, float]:
    """What a person waits for from a server just started (ms, and the server's CPU meanwhile): the
    runs list (it builds the run index), then the diff of the two 10k-event runs (nothing kept yet),
    then that diff again (kept)."""
    s = Serve(b.store, b.checkout)
    try:
        index, _, index_cpu = s.get("/api/runs")
        diff, size, diff_cpu = s.get(f"/api/diff?a={DIFF_A}&b={DIFF_B}")
        kept = s.get(f"/api/diff?a={DIFF_A}&b={DIFF_B}")[0]
    finally:
        s.close()
    ms = {"index": index, "index_cpu": index_cpu, "diff": diff, "diff_cpu": diff_cpu, "kept": kept}
    return {k: v * 1000 for k, v in ms.items()} | {"size": size}


def fresh_servers(builds: list[Build], rounds: int, figs: figures.Figures) -> None:
    """``rounds`` fresh servers per build, taking turns (``fresh_server``): a row for the first runs
    list, one for the first diff."""
    got = measure.alternate({b.name: partial(fresh_server, b) for b in builds}, rounds, rotate=True)
    med = {n: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for n, rows in got.items()}
    cpu = {
        n: {k: statistics.mean(r[k] for r in rows) for k in ("index_cpu", "diff_cpu")}
        for n, rows in got.items()
    }
    with closing(open_sql(builds[0].store)) as con:
        a, b = diffs.load_steps(con, DIFF_A), diffs.load_steps(con, DIFF_B)
        n_a, n_b = (
            con.execute("SELECT count(*) FROM events WHERE run_id = ?", [r]).fetchall()[0][0]
            for r in (DIFF_A, DIFF_B)
        )
    align = median_s(lambda: diffs.align(a, b), 3)
    index = {n: m["index"] for n, m in med.items()}
    shown = {n: f"{index[n]:.0f} ms, CPU {cpu[n]['index_cpu']:.0f} ms" for n in med}
    figs.add(
        "index",
        f"viewer API: runs list, first answer of a fresh server (builds the run index), median of {rounds}",
        f"**{index[THIS]:.0f} ms**, CPU {cpu[THIS]['index_cpu']:.0f} ms",
        beside(builds, index[THIS], index, shown),
    )
    diff = {n: m["diff"] for n, m in med.items()}
    shown = {
        n: f"{diff[n]:.0f} ms, CPU {cpu[n]['diff_cpu']:.0f} ms, kept {med[n]['kept']:.0f} ms" for n in med
    }
    figs.add(
        "diff",
        f"diff of two runs of {n_a:,} and {n_b:,} events, first answer of a fresh server, median of {rounds} "
        "(CPU: the server's mean)",
        f"**{diff[THIS]:.0f} ms** (max {max(r['diff'] for r in got[THIS]):.0f}), "
        f"CPU {cpu[THIS]['diff_cpu']:.0f} ms, {med[THIS]['size'] / 1024:.0f} KB; "
        f"kept {med[THIS]['kept']:.0f} ms; alignment alone {align * 1000:.0f} ms",
        beside(builds, diff[THIS], diff, shown),
        f"< 1 s ({figures.met(diff[THIS] < 1000)})",
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
    from this checkout or from another one, by that checkout's own .venv when it has one."""

    def __init__(self, root: Path, checkout: Path | None = None):
        env = dict(os.environ)
        cwd, python = None, sys.executable
        if checkout is not None:
            env["PYTHONPATH"] = str(checkout.resolve())
            cwd = str(checkout)
            own = checkout / ".venv" / "bin" / "python"
            python = str(own) if own.exists() else python
        code = "import sys; from amb.main import cli; sys.exit(cli())"
        self.proc = subprocess.Popen(
            [python, "-c", code, "serve", "--store", str(root.resolve()), "--port", "0"],
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

    def get(self, path: str) -> tuple[float, int, float]:
        """``path`` fetched: the wall seconds, the body's bytes, and the server's CPU seconds meanwhile
        (counted in clock ticks: only a sum over many requests says much)."""
        c0 = self.cpu_s()
        wall, size = fetch(self.url + path)
        return wall, size, self.cpu_s() - c0

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def first_paint(builds: list[Build], repeat: int, figs: figures.Figures) -> None:
    """A deep link into the middle of the 100k run, opened in a fresh page each time: how long until
    Chromium painted the linked row, beside a one-line page in the same browser; each build's viewer
    in turn."""
    from playwright.sync_api import sync_playwright

    servers = {b.name: Serve(b.store, b.checkout) for b in builds}
    try:
        for s in servers.values():  # the run index is built once per server, before any timing
            fetch(s.url + "/api/runs")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_flags())
            blank = measure.repeat(lambda: one_line_page(browser, servers[THIS].url), repeat)
            # Each round links one event, the same for every build, a different one each round.
            keys = iter(f"shim:{40000 + 997 * (i // len(servers))}" for i in range(repeat * len(servers)))
            got = measure.alternate(
                {n: partial(deep_link, browser, s, keys) for n, s in servers.items()},
                repeat,
                rotate=True,
            )
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
    ours = got[THIS]
    seen = {n: med(rows, "wall") for n, rows in got.items()}
    painted = {n: f"seen at {seen[n]:.0f} ms, painted at {med(got[n], 'painted'):.0f} ms" for n in got}
    other = beside(builds, seen[THIS], seen, painted)
    other = "" if other == figures.NONE else other + "; "
    figs.add(
        "paint",
        f"first paint of a run page at a deep link into the 100k run (Chromium, {repeat} fresh pages)",
        f"seen at **{seen[THIS]:.0f} ms** (max {max(r['wall'] for r in ours):.0f}), painted at "
        f"{med(ours, 'painted'):.0f} ms; server CPU {med(ours, 'cpu'):.0f} ms",
        f"{other}a one-line page: {statistics.median(blank) * 1000:.0f} ms",
        f"< 1 s ({figures.met(seen[THIS] < 1000)})",
    )


def one_line_page(browser: Any, base: str) -> None:
    """The baseline in the same browser: a fresh page that paints one line and fetches nothing."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(f"{base}/static/app.css", wait_until="commit")
    page.set_content("<p id=x>x</p>")
    page.wait_for_selector("#x", timeout=30_000)
    page.close()


def deep_link(browser: Any, server: Serve, keys: Iterator[str]) -> dict[str, float]:
    """A fresh page opened at the 100k run's next event of ``keys``: when the client saw the row marked, when
    the page painted it, the page's own timings, and the server's CPU meanwhile (ms)."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.add_init_script(MARK_TARGET)
    key = next(keys)
    c0 = server.cpu_s()
    t0 = time.perf_counter()
    page.goto(f"{server.url}/runs/{BIG}#{key}", wait_until="commit")
    page.wait_for_selector(f"[id='ev-{key}'].target", timeout=30_000)
    wall = time.perf_counter() - t0
    painted = page.evaluate(PAINTED)
    timing = page.evaluate(TIMING)
    # Everything else the page asks for, after the paint, before the server's CPU is read.
    page.wait_for_load_state("networkidle")
    cpu = (server.cpu_s() - c0) * 1000
    page.close()
    return {"wall": wall * 1000, "painted": painted or float("nan"), **timing, "cpu": cpu}


if __name__ == "__main__":
    main()
