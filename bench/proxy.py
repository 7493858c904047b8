"""bench/proxy: what recording costs, against the same loopback fake upstream in one run.

Targets, each a separate process (so the load generator, here, does not share their GIL): the fake
upstream itself (``direct``), a minimal asyncio TCP relay (``floor``), bare mitmproxy (``mitm``; it
buffers streams), mitmproxy with an addon that only turns streaming on (``mitm_stream``), and
``amb-record`` recording into a fresh store around an agent that waits (``amb``). ``--watch`` adds
``amb-watched``, followed by ``amb watch --all-running --json``; ``--against`` adds ``amb-prev``,
another checkout's. Rounds interleave the targets so that machine-load drift hits all alike. What
is measured and how to read it: docs/recording.md#overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import figures
from bench.figures import NONE
from bench.measure import alternate, percentile, process_cpu_seconds, timed

PY = sys.executable
BIN = Path(PY).parent

FLOOR_PROXY = r"""
import asyncio, sys
UP_HOST, UP_PORT = sys.argv[1], int(sys.argv[2])
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except ConnectionError:
        pass
    finally:
        w.close()
async def handle(cr, cw):
    ur, uw = await asyncio.open_connection(UP_HOST, UP_PORT)
    await asyncio.gather(pipe(cr, uw), pipe(ur, cw))
async def main():
    s = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(s.sockets[0].getsockname()[1], flush=True)
    await s.serve_forever()
asyncio.run(main())
"""

STREAM_ADDON = r"""
def responseheaders(flow):
    if "text/event-stream" in flow.response.headers.get("content-type", ""):
        flow.response.stream = True
"""

REAL_KEYS = {"OPENAI_API_KEY": "sk-proj-" + "k3Y" * 52, "ANTHROPIC_API_KEY": "sk-ant-api03-" + "q7Z" * 32}
"""Keys of a real run's lengths (164 and 109 characters): amb-record scrubs every stored body for
them, so a bench without keys would leave that cost out. The fake upstream ignores them."""

WAIT_AGENT = (
    "import os, sys, time; e = os.environ; "
    "print(e['OPENAI_BASE_URL'], e.get('GOOGLE_GEMINI_BASE_URL', ''), flush=True); time.sleep(100000)"
)
"""Prints the reverse endpoints (the Gemini one only from a checkout that has it) and waits."""

GEMINI = {
    "contents": [
        {"role": "user", "parts": [{"text": "You are a careful agent. " * 24}]},
        {"role": "user", "parts": [{"text": "hi"}]},
    ]
}
GEMINI_STREAM = "/v1beta/models/bench:streamGenerateContent?alt=sse"

CHAT = {
    "model": "bench",
    "messages": [
        {"role": "system", "content": "You are a careful agent. " * 24},
        {"role": "user", "content": "hi"},
    ],
}


class Target:
    def __init__(self, name: str, base: str, proc: subprocess.Popen, gemini: str | None = None):
        self.name, self.base, self.proc = name, base, proc
        self.gemini = gemini or base
        """Where Gemini calls go (amb-record has a reverse endpoint per upstream)."""
        self.sidecar: subprocess.Popen | None = None
        """A process that goes with the target (``amb watch`` beside ``amb-watched``)."""
        self.sidecar_cpu_s: float | None = None
        """The sidecar's CPU time (user + system) when it was stopped."""

    def stop(self) -> None:
        if self.sidecar is not None and self.sidecar.poll() is None:
            self.sidecar_cpu_s = process_cpu_seconds(self.sidecar.pid)
            _end(self.sidecar, signal.SIGINT, 10)
        _end(self.proc, signal.SIGTERM, 30)


def _end(proc: subprocess.Popen, sig: int, wait_s: float) -> None:
    """Stop ``proc`` with ``sig``, killed if it has not ended within ``wait_s``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def _first_line(proc: subprocess.Popen, what: str) -> str:
    assert proc.stdout is not None, "started with stdout=PIPE"
    line = proc.stdout.readline().strip()
    if not line:
        raise SystemExit(f"bench: {what} did not start: {proc.stderr.read() if proc.stderr else ''}")
    return line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int) -> None:
    for _ in range(3000):  # 60 s: mitmdump can take seconds to start on a loaded machine
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise SystemExit(f"bench: port {port} never opened")


BUDGET_ARGS = ["--max-calls", str(10**12), "--max-tokens", str(10**15)]
"""``--budget``: limits that never bite, so every call goes through the budget's admission and
settling (``--max-cost`` is left out: the bench's model names are in no price table)."""


def start_targets(tmp: Path, against: Path | None, watch: bool, budget: bool) -> list[Target]:
    fake = subprocess.Popen(
        [PY, str(ROOT / "tests" / "fakes" / "upstream.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    up = _first_line(fake, "the fake upstream")
    host, port = up.removeprefix("http://").split(":")
    targets = [Target("direct", up, fake)]

    floor = subprocess.Popen([PY, "-c", FLOOR_PROXY, host, port], stdout=subprocess.PIPE, text=True)
    targets.append(Target("floor", f"http://127.0.0.1:{_first_line(floor, 'the floor proxy')}", floor))

    (tmp / "stream_addon.py").write_text(STREAM_ADDON)
    for name, extra in (("mitm", []), ("mitm_stream", ["-s", str(tmp / "stream_addon.py")])):
        p = _free_port()
        mode = ["--mode", f"reverse:{up}@127.0.0.1:{p}", "--set", "connection_strategy=lazy"]
        proc = subprocess.Popen(
            [str(BIN / "mitmdump"), "-q", "--set", f"confdir={tmp / ('conf-' + name)}", *mode, *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(p)
        targets.append(Target(name, f"http://127.0.0.1:{p}", proc))

    both = ["--upstream", f"openai={up}", "--upstream", f"gemini={up}"]
    amb = _start_recorder([str(BIN / "amb-record")], tmp / "store", [*both, *(BUDGET_ARGS if budget else [])])
    targets.append(_amb_target("amb", amb, "amb-record" + (" with a budget" if budget else "")))
    if watch:
        store = tmp / "store-watched"
        watched = _start_recorder([str(BIN / "amb-record")], store, both)
        target = _amb_target("amb-watched", watched, "amb-record (watched)")
        follow = ["watch", "--all-running", "--json", "--interval", "0.1", "--store", str(store)]
        target.sidecar = subprocess.Popen(
            [str(BIN / "amb"), *follow],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        targets.append(target)
    if against is not None:  # the same command from another checkout, its packages first on the path
        # A checkout from before Gemini support takes no gemini upstream: its Gemini calls go to its
        # OpenAI endpoint, which forwards them as they are (recorded as traffic).
        has_gemini = any(
            (against / p).is_file() for p in ("schemas/providers/gemini.py", "recorder/proxy/gemini.py")
        )
        prev = _start_recorder(
            [PY, "-c", "import sys; from amb.record import main; sys.exit(main())"],
            tmp / "store-prev",
            both if has_gemini else both[:2],
            PYTHONPATH=str(against),
        )
        targets.append(_amb_target("amb-prev", prev, "amb-record from " + str(against)))
    return targets


def _start_recorder(command: list[str], store: Path, options: list[str], **env: str) -> subprocess.Popen:
    """``amb-record`` (run as ``command``) into ``store``, its agent waiting to be stopped; it prints
    its endpoints on its first line (read by ``_amb_target``)."""
    return subprocess.Popen(
        [*command, "--store", str(store), "--no-ingest", *options, "--", PY, "-c", WAIT_AGENT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=store.parent,
        env={**os.environ, **REAL_KEYS, **env},
    )


def _amb_target(name: str, proc: subprocess.Popen, what: str) -> Target:
    openai_base, _, gemini = _first_line(proc, what).partition(" ")
    return Target(name, openai_base.removesuffix("/v1"), proc, gemini.strip() or None)


# -- measurements ----------------------------------------------------------------------------------


def sequential(targets: list[Target], n: int, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    clients = {t.name: httpx.Client(base_url=t.base, timeout=30) for t in targets}
    for c in clients.values():
        for _ in range(20):
            c.post("/v1/chat/completions", json=CHAT)
    for _ in range(rounds):
        for t in targets:
            c = clients[t.name]
            for _ in range(n // rounds):
                r, seconds = timed(partial(c.post, "/v1/chat/completions", json=CHAT))
                out[t.name].append(seconds * 1000)
                assert r.status_code == 200, (t.name, r.status_code)
    for c in clients.values():
        c.close()
    return out


def first_chunks(
    bases: dict[str, str], path: str, body: dict, headers: dict[str, str], n: int, rounds: int
) -> dict[str, tuple[list[float], list[int]]]:
    """Per target (name -> base URL), ``n`` streamed POSTs of 50 chunks in ``rounds`` alternating
    rounds: the time to the first chunk (ms) and the client's reads per stream."""
    out: dict[str, tuple[list[float], list[int]]] = {name: ([], []) for name in bases}
    clients = {name: httpx.Client(base_url=base, timeout=30) for name, base in bases.items()}
    for _ in range(rounds):
        for name, c in clients.items():
            for _ in range(n // rounds):
                t0 = time.perf_counter()
                first, reads = None, 0
                with c.stream("POST", path, json=body, headers=headers) as r:
                    assert r.status_code == 200, (name, r.status_code)
                    for _chunk in r.iter_raw():
                        reads += 1
                        if first is None:
                            first = (time.perf_counter() - t0) * 1000
                out[name][0].append(first or 0.0)
                out[name][1].append(reads)
    for c in clients.values():
        c.close()
    return out


def throughput(target: Target, clients: int, seconds: float) -> float:
    counts = [0] * clients
    # The window opens once every client exists: on a loaded machine making them can take longer
    # than the window itself.
    window: dict[str, float] = {}

    def open_window() -> None:  # run once, by the last to arrive, before anyone is released
        window["t0"] = time.monotonic()
        window["stop"] = window["t0"] + seconds

    ready = threading.Barrier(clients + 1, action=open_window)

    def worker(i: int) -> None:
        with httpx.Client(base_url=target.base, timeout=30) as c:
            ready.wait()
            while time.monotonic() < window["stop"]:
                c.post("/v1/chat/completions", json=CHAT)
                counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - window["t0"])


BIG = {
    "model": "bench",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64," + "A" * (5 * 1024 * 1024)},
                },
            ],
        }
    ],
}
BIG_BYTES = json.dumps(BIG).encode()
JSON_BODY = {"content-type": "application/json"}


def big_requests(targets: list[Target], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    clients = {t.name: httpx.Client(base_url=t.base, timeout=60) for t in targets}
    for i in range(n):
        # The order rotates: whatever one target leaves behind (a flush, freed memory) must not
        # always land on the same next target.
        for t in targets[i % len(targets) :] + targets[: i % len(targets)]:
            body = BIG_BYTES.replace(b"what is this", f"what is {i:04d}".encode())  # a new blob each time
            post = partial(clients[t.name].post, "/v1/chat/completions", content=body, headers=JSON_BODY)
            r, seconds = timed(post)
            out[t.name].append(seconds * 1000)
            assert r.status_code == 200
    for c in clients.values():
        c.close()
    return out


def stall(target: Target, streams: int, with_uploads: bool) -> float:
    """Median over ``streams`` of the longest gap between reads of a 50×10 ms stream."""
    gaps: list[float] = []
    stop = threading.Event()

    def uploader() -> None:
        with httpx.Client(base_url=target.base, timeout=60) as c:
            i = 0
            while not stop.is_set():
                i += 1
                body = BIG_BYTES.replace(b"what is this", f"stall {i:06d}".encode())
                c.post("/v1/chat/completions", content=body, headers=JSON_BODY)

    up = threading.Thread(target=uploader)
    if with_uploads:
        up.start()
        time.sleep(0.2)
    body = {**CHAT, "stream": True}
    headers = {"x-fake-chunks": "50", "x-fake-delay-ms": "10"}
    with httpx.Client(base_url=target.base, timeout=60) as c:
        for _ in range(streams):
            last, worst = None, 0.0
            with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                for _chunk in r.iter_raw():
                    now = time.perf_counter()
                    if last is not None:
                        worst = max(worst, now - last)
                    last = now
            gaps.append(worst * 1000)
    stop.set()
    if with_uploads:
        up.join()
    return statistics.median(gaps)


# -- report ----------------------------------------------------------------------------------------


@dataclass
class Results:
    """Every target's measurements, by target name (ms unless named otherwise)."""

    seq: dict[str, list[float]]
    ttfc: dict[str, tuple[list[float], list[int]]]
    """Chat Completions streams: times to the first chunk, and the client's reads per stream."""
    gem: dict[str, tuple[list[float], list[int]]]
    """The same for the Gemini API's stream."""
    tput: dict[str, float]
    """Calls per second with 16 clients."""
    big: dict[str, list[float]]
    gaps: dict[str, tuple[float, float]]
    """A paced stream's longest gap: alone, and beside 5 MB uploads."""

    def p50(self, name: str) -> float:
        return percentile(self.seq[name], 50)

    def p99(self, name: str) -> float:
        return percentile(self.seq[name], 99)

    def big_added(self, name: str) -> float:
        """What a 5 MB request through ``name`` takes beyond one sent directly (p50)."""
        return percentile(self.big[name], 50) - percentile(self.big["direct"], 50)

    def big_ratio(self, name: str) -> float:
        return self.big_added(name) / max(1e-9, self.big_added("mitm"))

    def calls_ratio(self, name: str) -> float:
        return self.tput[name] / max(self.tput["mitm"], 1e-9)

    def gap_ratio(self, name: str) -> float:
        return self.gaps[name][1] / self.gaps["mitm_stream"][1]


def first_chunk_added(streams: dict[str, tuple[list[float], list[int]]], name: str) -> float:
    return percentile(streams[name][0], 50) - percentile(streams["direct"][0], 50)


def reads(streams: dict[str, tuple[list[float], list[int]]], name: str) -> float:
    return statistics.median(streams[name][1])


def target(text: str, ok: bool) -> str:
    return f"{text} ({figures.met(ok)})"


def add_rows(figs: figures.Figures, r: Results, against: Path | None) -> None:
    """The README's rows: ``amb-record`` beside direct calls and bare mitmproxy, in the same rounds
    (and beside ``--against``'s build where it ran)."""
    cost, p99 = r.p50("amb") - r.p50("mitm"), r.p99("amb") - r.p99("direct")
    ttfc, gem = first_chunk_added(r.ttfc, "amb"), first_chunk_added(r.gem, "amb")
    prev = {}
    if "amb-prev" in r.seq:
        name = figures.build_name(against) if against else "amb-prev"
        prev = {
            "p50": f"; {name}: {r.p50('amb-prev') - r.p50('mitm'):+.2f} ms",
            "big": f"; {name}: {r.big_ratio('amb-prev'):.2f}×",
            "calls": f"; {name}: {r.calls_ratio('amb-prev'):.2f}×",
        }
    figs.add(
        "recording-p50",
        "recording cost over bare mitmproxy, non-streaming p50 ([overhead](docs/recording.md#overhead))",
        f"{cost:+.2f} ms",
        f"bare mitmproxy (`mitmdump`): p50 {r.p50('mitm'):.2f} ms{prev.get('p50', '')}",
        target("≤ 0.3 ms", cost <= 0.3),
    )
    figs.add(
        "p99",
        "added p99 over direct calls",
        f"{p99:.2f} ms",
        f"direct: {r.p99('direct'):.2f} ms",
        target("≤ 5 ms", p99 <= 5),
    )
    figs.add(
        "ttfc",
        "added time to first chunk of a 50-chunk stream; client reads per stream",
        f"{ttfc:.2f} ms; {reads(r.ttfc, 'amb'):.0f} reads",
        f"direct: {reads(r.ttfc, 'direct'):.0f} reads (one per upstream chunk)",
        f"{target('≤ 1.5 ms', ttfc <= 1.5)}; "
        + target("as many reads", reads(r.ttfc, "amb") >= 0.9 * reads(r.ttfc, "direct")),
    )
    figs.add(
        "gemini-ttfc",
        "Gemini stream (`streamGenerateContent`, SSE): added time to first chunk; reads",
        f"{gem:.2f} ms; {reads(r.gem, 'amb'):.0f} reads",
        f"direct: {reads(r.gem, 'direct'):.0f} reads",
        target("≤ 1.5 ms, as many reads", gem <= 1.5 and reads(r.gem, "amb") >= 0.9 * reads(r.gem, "direct")),
    )
    figs.add(
        "big",
        "a 5 MB request: time added over direct",
        f"{r.big_ratio('amb'):.2f}× bare mitmproxy's",
        f"bare mitmproxy: +{r.big_added('mitm'):.1f} ms{prev.get('big', '')}",
        target("≤ 1.2×", r.big_ratio("amb") <= 1.2),
    )
    figs.add(
        "gap",
        "a stream's longest gap between chunks beside 5 MB uploads",
        f"{r.gap_ratio('amb'):.2f}× streaming mitmproxy's",
        f"mitmproxy, streaming only: {r.gaps['mitm_stream'][1]:.1f} ms",
        target("≤ 1.5×", r.gap_ratio("amb") <= 1.5),
    )
    figs.add(
        "calls",
        "calls/s, 16 concurrent clients, median of 3 rounds",
        f"{r.calls_ratio('amb'):.2f}× bare mitmproxy's ({r.tput['amb']:.0f}/s)",
        f"bare mitmproxy: {r.tput['mitm']:.0f}/s{prev.get('calls', '')}",
        target("≥ 0.9×", r.calls_ratio("amb") >= 0.9),
    )


def add_budget_row(figs: figures.Figures, r: Results, against: Path | None) -> None:
    """``--budget``: the amb target kept a budget, so its figures are this row's, not the plain rows'."""
    beside = NONE
    if "amb-prev" in r.seq and against is not None:
        beside = f"{figures.build_name(against)} without: p50 {r.p50('amb-prev'):.1f} ms"
    figs.add(
        "budget",
        "`amb-record` with a budget set and never reached (`--max-calls`, `--max-tokens`)",
        f"p50 {r.p50('amb'):.1f} ms, p99 {r.p99('amb'):.0f} ms, calls/s {r.tput['amb']:.0f}, "
        f"5 MB {r.big_ratio('amb'):.2f}× bare mitmproxy",
        beside,
        "no regression",
    )


def add_watched_row(figs: figures.Figures, r: Results, watcher_cpu: float, seconds: float) -> None:
    w = "amb-watched"
    figs.add(
        "watched",
        "`amb-record` followed by `amb watch --all-running --json` (`--watch`)",
        f"calls/s {r.tput[w] / max(r.tput['amb'], 1e-9):.2f}×, p50 {r.p50(w):.2f} ms; "
        f"the watcher's CPU {watcher_cpu:.1f} s in {seconds:.0f} s",
        f"unwatched, same rounds: p50 {r.p50('amb'):.2f} ms",
        "no regression",
    )


def measure(targets: list[Target], quick: bool) -> Results:
    n_seq, n_stream, n_big, secs, n_stall = (120, 30, 6, 2.0, 3) if quick else (600, 90, 120, 6.0, 8)
    # Interleaved rounds (the median of each target's rounds): load elsewhere on the machine falls
    # on every target alike.
    rounds = alternate({t.name: partial(throughput, t, 16, secs / 3) for t in targets}, 3)
    chat_stream = {**CHAT, "stream": True}
    chat_headers = {"x-fake-chunks": "50", "x-fake-delay-ms": "0"}
    gemini_headers = {"x-fake-chunks": "50", "x-goog-api-key": "bench"}
    return Results(
        seq=sequential(targets, n_seq, 6),
        ttfc=first_chunks(
            {t.name: t.base for t in targets}, "/v1/chat/completions", chat_stream, chat_headers, n_stream, 3
        ),
        gem=first_chunks(
            {t.name: t.gemini for t in targets}, GEMINI_STREAM, GEMINI, gemini_headers, n_stream, 3
        ),
        tput={name: statistics.median(r) for name, r in rounds.items()},
        big=big_requests(targets, n_big),
        gaps={
            t.name: (stall(t, n_stall, False), stall(t, n_stall, True))
            for t in targets
            if t.name in ("direct", "mitm_stream", "amb", "amb-prev", "amb-watched")
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisier)")
    ap.add_argument(
        "--against",
        type=Path,
        metavar="CHECKOUT",
        help="also measure amb-record from another checkout (e.g. a `git worktree` of an older "
        "commit) as target amb-prev, in the same rounds: how to see what a change did",
    )
    ap.add_argument(
        "--watch",
        action="store_true",
        help="also measure amb-record with `amb watch` following its spools (target amb-watched)",
    )
    ap.add_argument(
        "--budget",
        action="store_true",
        help="record the amb target under a budget that never bites (amb-record --max-calls, "
        "--max-tokens): what keeping a budget costs each call",
    )
    figures.add_argument(ap, "proxy")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    if args.against is not None and not (args.against / "amb" / "record.py").is_file():
        raise SystemExit(f"bench: {args.against} is not a checkout of this project (no amb/record.py)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="amb-bench-") as tmpdir:
        targets = start_targets(Path(tmpdir), args.against, args.watch, args.budget)
        try:
            print(f"targets: {', '.join(t.name for t in targets)}", file=sys.stderr)
            results = measure(targets, args.quick)
        finally:
            for t in reversed(targets):
                t.stop()
    if args.budget:
        add_budget_row(figs, results, args.against)
    else:
        add_rows(figs, results, args.against)
    if args.watch:
        watcher_cpu = next(t.sidecar_cpu_s for t in targets if t.name == "amb-watched") or 0.0
        add_watched_row(figs, results, watcher_cpu, time.monotonic() - started)
    figs.write()


if __name__ == "__main__":
    main()
