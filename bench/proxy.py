"""bench/proxy: what recording costs, against the same loopback fake upstream in one run.

Targets, each a separate process (so the load generator, here, does not share their GIL):
- ``direct``: the fake upstream itself (``tests/fakes/upstream.py``);
- ``floor``: a minimal asyncio pass-through proxy (a TCP relay: no HTTP parsing at all);
- ``mitm``: bare mitmproxy 11.0.2 in reverse mode, no addon (note: it BUFFERS streams);
- ``mitm_stream``: mitmproxy with a 4-line addon that only turns streaming on (no recording);
- ``amb``: ``amb-record``'s proxy, recording into a fresh store (started by ``amb-record`` itself,
  around a placeholder agent that just waits).

Prints, per target: sequential non-streaming latency (p50/p99, added over direct), time to first
chunk of a 50-chunk stream (and client reads per stream; Chat Completions, and the Gemini API's
SSE stream), calls per second with 16 concurrent
clients, the cost of a 5 MB request, and the longest inter-chunk gap of a paced stream while
5 MB requests go through beside it. Then the proxy's targets as ratios. Rounds interleave the
targets so machine-load drift hits all alike.

With ``--watch``, target ``amb-watched`` is a second ``amb-record`` whose store an ``amb watch
--all-running --json`` follows the whole time (every 0.1 s, its JSON lines read and dropped): what a
live watcher costs the recording, side by side with ``amb`` in the same rounds.

Run: .venv/bin/python bench/proxy.py [--quick] [--against CHECKOUT] [--watch]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import figures
from bench.figures import NONE

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
    def __init__(self, name: str, base: str, proc: subprocess.Popen | None, gemini: str | None = None):
        self.name, self.base, self.proc = name, base, proc
        self.gemini = gemini or base
        """Where Gemini calls go (amb-record has a reverse endpoint per upstream)."""
        self.sidecar: subprocess.Popen | None = None
        """A process that goes with the target (``amb watch`` beside ``amb-watched``)."""

        self.sidecar_cpu_s: float | None = None
        """The sidecar's CPU time (user + system) when it was stopped."""

    def stop(self) -> None:
        if self.sidecar is not None and self.sidecar.poll() is None:
            self.sidecar_cpu_s = _cpu_seconds(self.sidecar.pid)
            self.sidecar.send_signal(signal.SIGINT)
            try:
                self.sidecar.wait(10)
            except subprocess.TimeoutExpired:
                self.sidecar.kill()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _first_line(proc: subprocess.Popen, what: str) -> str:
    assert proc.stdout is not None, "started with stdout=PIPE"
    line = proc.stdout.readline().strip()
    if not line:
        raise SystemExit(f"bench: {what} did not start: {proc.stderr.read() if proc.stderr else ''}")
    return line


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int) -> None:
    import socket

    for _ in range(3000):  # 60 s: mitmdump takes more than 6 s to start on a machine at load 17
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise SystemExit(f"bench: port {port} never opened")


BUDGET_ARGS = ["--max-calls", str(10**12), "--max-tokens", str(10**15)]
"""``--budget``: limits that never bite, so every call goes through the budget's admission and
settling (``--max-cost`` is left out: the bench's model names are in no price table)."""


def start_targets(
    tmp: Path, against: Path | None = None, watch: bool = False, budget: bool = False
) -> list[Target]:
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
        proc = subprocess.Popen(
            [
                str(BIN / "mitmdump"),
                "-q",
                "--set",
                f"confdir={tmp / ('conf-' + name)}",
                "--mode",
                f"reverse:{up}@127.0.0.1:{p}",
                "--set",
                "connection_strategy=lazy",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(p)
        targets.append(Target(name, f"http://127.0.0.1:{p}", proc))

    both = ["--upstream", f"openai={up}", "--upstream", f"gemini={up}"]
    amb = _start_recorder([str(BIN / "amb-record")], tmp / "store", [*both, *(BUDGET_ARGS if budget else [])])
    targets.append(_amb_target("amb", amb, "amb-record" + (" with a budget" if budget else "")))
    if watch:
        watched = _start_recorder([str(BIN / "amb-record")], tmp / "store-watched", both)
        target = _amb_target("amb-watched", watched, "amb-record (watched)")
        target.sidecar = subprocess.Popen(
            [
                str(BIN / "amb"),
                "watch",
                "--all-running",
                "--json",
                "--interval",
                "0.1",
                "--store",
                str(tmp / "store-watched"),
            ],
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


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


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
                t0 = time.perf_counter()
                r = c.post("/v1/chat/completions", json=CHAT)
                out[t.name].append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200, (t.name, r.status_code)
    for c in clients.values():
        c.close()
    return out


def _first_chunks(
    bases: dict[str, str], path: str, body: dict, headers: dict[str, str], n: int, rounds: int
) -> dict[str, tuple[list[float], list[int]]]:
    """Per target (name -> base URL), ``n`` streamed POSTs in ``rounds`` alternating rounds: the time to
    the first chunk (ms) and the client's reads per stream."""
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


def streaming(
    targets: list[Target], n: int, rounds: int, delay_ms: int
) -> dict[str, tuple[list[float], list[int]]]:
    """Chat Completions streams of 50 chunks, ``delay_ms`` apart: time to first chunk, reads per stream."""
    headers = {"x-fake-chunks": "50", "x-fake-delay-ms": str(delay_ms)}
    bases = {t.name: t.base for t in targets}
    return _first_chunks(bases, "/v1/chat/completions", {**CHAT, "stream": True}, headers, n, rounds)


def gemini_streaming(targets: list[Target], n: int, rounds: int) -> dict[str, tuple[list[float], list[int]]]:
    """The Gemini API's SSE stream (``streamGenerateContent?alt=sse``, 50 text chunks): time to the
    first chunk and client reads per stream, as ``streaming`` measures Chat Completions."""
    headers = {"x-fake-chunks": "50", "x-goog-api-key": "bench"}
    return _first_chunks({t.name: t.gemini for t in targets}, GEMINI_STREAM, GEMINI, headers, n, rounds)


def throughput(target: Target, clients: int, seconds: float) -> float:
    counts = [0] * clients
    # The window opens once every client exists: making 16 clients took longer than the 2 s window
    # at load average 27, and every target read 0 calls/s.
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


def big_requests(targets: list[Target], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    clients = {t.name: httpx.Client(base_url=t.base, timeout=60) for t in targets}
    for i in range(n):
        # The order rotates: whatever one target leaves behind (a flush, freed memory) must not
        # always land on the same next target.
        for t in targets[i % len(targets) :] + targets[: i % len(targets)]:
            body = BIG_BYTES.replace(b"what is this", f"what is {i:04d}".encode())  # a new blob each time
            t0 = time.perf_counter()
            r = clients[t.name].post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
            out[t.name].append((time.perf_counter() - t0) * 1000)
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
                c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})

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
    q = args.quick
    n_seq, n_stream, n_big, secs, n_stall = (120, 30, 6, 2.0, 3) if q else (600, 90, 120, 6.0, 8)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="amb-bench-") as tmpdir:
        targets = start_targets(Path(tmpdir), args.against, args.watch, args.budget)
        names = [t.name for t in targets]
        try:
            print(
                f"targets: {', '.join(names)}; load average {os.getloadavg()[0]:.1f} on "
                f"{os.cpu_count()} cores"
            )
            seq = sequential(targets, n_seq, 6)
            ttfb = streaming(targets, n_stream, 3, 0)
            gem = gemini_streaming(targets, n_stream, 3)
            # Interleaved rounds (the median of each target's rounds): a single back-to-back window
            # per target let a burst of load elsewhere on the machine land on one target only.
            rounds: dict[str, list[float]] = {t.name: [] for t in targets}
            for _ in range(3):
                for t in targets:
                    rounds[t.name].append(throughput(t, 16, secs / 3))
            tput = {name: statistics.median(r) for name, r in rounds.items()}
            big = big_requests(targets, n_big)
            gaps = {
                t.name: (stall(t, n_stall, False), stall(t, n_stall, True))
                for t in targets
                if t.name in ("direct", "mitm_stream", "amb", "amb-prev", "amb-watched")
            }
        finally:
            for t in reversed(targets):
                t.stop()

    d50, d99 = pct(seq["direct"], 50), pct(seq["direct"], 99)
    t50 = pct(ttfb["direct"][0], 50)
    b50 = pct(big["direct"], 50)
    print("\nnon-streaming chat completion, sequential, keep-alive (ms)")
    print(f"{'target':12} {'p50':>7} {'p99':>7} {'+p50':>7} {'+p99':>7}")
    for name in names:
        p50, p99 = pct(seq[name], 50), pct(seq[name], 99)
        print(f"{name:12} {p50:7.2f} {p99:7.2f} {p50 - d50:7.2f} {p99 - d99:7.2f}")
    print("\nstream of 50 chunks, unpaced: time to first chunk (ms) and client reads per stream")
    print(f"{'target':12} {'ttfc p50':>9} {'added':>7} {'reads':>6}")
    for name in names:
        f50 = pct(ttfb[name][0], 50)
        print(f"{name:12} {f50:9.2f} {f50 - t50:7.2f} {statistics.median(ttfb[name][1]):6.0f}")
    print(
        "\nGemini stream of 50 chunks (streamGenerateContent, SSE), unpaced: time to first chunk (ms), reads"
    )
    g50 = pct(gem["direct"][0], 50)
    print(f"{'target':12} {'ttfc p50':>9} {'added':>7} {'reads':>6}")
    for name in names:
        f50 = pct(gem[name][0], 50)
        print(f"{name:12} {f50:9.2f} {f50 - g50:7.2f} {statistics.median(gem[name][1]):6.0f}")
    print("\n16 concurrent clients, non-streaming: calls per second (median of 3 interleaved rounds)")
    for name in names:
        print(f"{name:12} {tput[name]:9.0f}")
    print("\n5 MB request body, sequential (ms)")
    for name in names:
        p50 = pct(big[name], 50)
        print(f"{name:12} {p50:8.1f}  added {p50 - b50:6.1f}")
    print("\nlongest gap between chunks of a 50 x 10 ms stream, median of streams (ms)")
    for name, (alone, loaded) in gaps.items():
        print(
            f"{name:12} alone {alone:6.1f}   beside 5 MB uploads {loaded:6.1f}   "
            f"stretch {loaded / alone:4.2f}x"
        )

    m50, a50 = pct(seq["mitm"], 50), pct(seq["amb"], 50)
    a99 = pct(seq["amb"], 99)
    ms_ttfc = pct(ttfb["mitm_stream"][0], 50)
    a_ttfc = pct(ttfb["amb"][0], 50)
    big_ratio = (pct(big["amb"], 50) - b50) / max(1e-9, pct(big["mitm"], 50) - b50)
    gap_ratio = gaps["amb"][1] / gaps["mitm_stream"][1]
    print("\ntargets")
    checks = [
        ("recording cost over bare mitmproxy, p50", f"{a50 - m50:+.2f} ms", a50 - m50 <= 0.3, "<= 0.3 ms"),
        ("added p99 over direct", f"{a99 - d99:.2f} ms", a99 - d99 <= 5, "<= 5 ms"),
        ("added time to first chunk over direct", f"{a_ttfc - t50:.2f} ms", a_ttfc - t50 <= 1.5, "<= 1.5 ms"),
        (
            "Gemini stream: added time to first chunk over direct, reads vs direct",
            f"{pct(gem['amb'][0], 50) - g50:.2f} ms, "
            f"{statistics.median(gem['amb'][1]):.0f} vs {statistics.median(gem['direct'][1]):.0f}",
            pct(gem["amb"][0], 50) - g50 <= 1.5
            and statistics.median(gem["amb"][1]) >= 0.9 * statistics.median(gem["direct"][1]),
            "<= 1.5 ms, as many reads",
        ),
        (
            "client reads per 50-chunk stream vs direct",
            f"{statistics.median(ttfb['amb'][1]):.0f} vs {statistics.median(ttfb['direct'][1]):.0f}",
            statistics.median(ttfb["amb"][1]) >= 0.9 * statistics.median(ttfb["direct"][1]),
            "as many as direct: one per upstream chunk, nothing buffered",
        ),
        ("5 MB request, added time vs bare mitmproxy's", f"{big_ratio:.2f}x", big_ratio <= 1.2, "<= 1.2x"),
        (
            "stream's longest gap beside 5 MB uploads vs mitm_stream",
            f"{gap_ratio:.2f}x",
            gap_ratio <= 1.5,
            "<= 1.5x",
        ),
        (
            "calls/s at 16 clients vs bare mitmproxy",
            f"{tput['amb'] / max(tput['mitm'], 1e-9):.2f}x",
            tput["amb"] / max(tput["mitm"], 1e-9) >= 0.9,
            ">= 0.9x",
        ),
    ]
    for what, value, ok, target in checks:
        print(f"  [{'ok' if ok else 'MISS'}] {what}: {value} (target {target})")
    keys = ["p50", "p99", "ttfc", "gemini", "reads", "big", "gap", "calls"]
    checked = dict(zip(keys, ((v, ok, target) for _, v, ok, target in checks), strict=True))
    if "amb-prev" in seq:
        print(
            f"  amb-prev ({args.against}), same rounds: p50 cost {pct(seq['amb-prev'], 50) - m50:+.2f} ms; "
            f"5 MB {(pct(big['amb-prev'], 50) - b50) / max(1e-9, pct(big['mitm'], 50) - b50):.2f}x; "
            f"gap {gaps['amb-prev'][1] / gaps['mitm_stream'][1]:.2f}x; "
            f"calls/s {tput['amb-prev'] / max(tput['mitm'], 1e-9):.2f}x; "
            f"TTFC {pct(ttfb['amb-prev'][0], 50) - t50:+.2f} ms, "
            f"Gemini TTFC {pct(gem['amb-prev'][0], 50) - g50:+.2f} ms"
        )
    if "amb-watched" in seq:
        w = "amb-watched"
        watcher_cpu = next(t.sidecar_cpu_s for t in targets if t.name == w)
        if watcher_cpu is not None:
            print(
                f"  amb watch used {watcher_cpu:.1f} s of CPU in {time.monotonic() - started:.0f} s "
                "(following every call the benchmark made to amb-watched)"
            )
        print(
            f"  amb-watched (amb watch following its spools) beside amb, same rounds: "
            f"p50 {pct(seq[w], 50):.2f} vs {a50:.2f} ms; p99 {pct(seq[w], 99):.2f} vs {a99:.2f} ms; "
            f"TTFC {pct(ttfb[w][0], 50):.2f} vs {a_ttfc:.2f} ms; "
            f"5 MB {pct(big[w], 50):.1f} vs {pct(big['amb'], 50):.1f} ms; "
            f"calls/s {tput[w]:.0f} vs {tput['amb']:.0f} ({tput[w] / max(tput['amb'], 1e-9):.2f}x); "
            f"gap beside uploads {gaps[w][1]:.1f} vs {gaps['amb'][1]:.1f} ms"
        )
    big_vs_stream = (pct(big["amb"], 50) - b50) / max(1e-9, pct(big["mitm_stream"], 50) - b50)
    print(
        f"  (reference: mitm_stream TTFC {ms_ttfc - t50:+.2f} ms over direct; floor p50 "
        f"{pct(seq['floor'], 50) - d50:+.2f} ms; 5 MB vs mitm_stream {big_vs_stream:.2f}x. Bare "
        "mitmproxy and mitm_stream differ only in streaming SSE, so their spread shows the run's noise.)"
    )
    if args.budget:  # the amb target kept a budget: its figures are this row's, not the plain rows'
        beside = NONE
        if "amb-prev" in seq:
            beside = f"{figures.build_name(args.against)} without: p50 {pct(seq['amb-prev'], 50):.1f} ms"
        figs.add(
            "budget",
            "`amb-record` with a budget set and never reached (`--max-calls`, `--max-tokens`)",
            f"p50 {a50:.1f} ms, p99 {a99:.0f} ms, calls/s {tput['amb']:.0f}, "
            f"5 MB {big_ratio:.2f}× bare mitmproxy",
            beside,
            "no regression",
        )
    else:
        prev = {}
        m_big = pct(big["mitm"], 50) - b50
        if "amb-prev" in seq:
            name = figures.build_name(args.against)
            prev = {
                "p50": f"; {name}: {pct(seq['amb-prev'], 50) - m50:+.2f} ms",
                "big": f"; {name}: {(pct(big['amb-prev'], 50) - b50) / max(1e-9, m_big):.2f}×",
                "calls": f"; {name}: {tput['amb-prev'] / max(tput['mitm'], 1e-9):.2f}×",
            }
        for row in proxy_rows(checked, seq, ttfb, gem, tput, big, gaps, prev):
            figs.add(*row)
    if "amb-watched" in seq:
        w = "amb-watched"
        watcher_cpu = next(t.sidecar_cpu_s for t in targets if t.name == w) or 0.0
        figs.add(
            "watched",
            "`amb-record` followed by `amb watch --all-running --json` (`--watch`)",
            f"calls/s {tput[w] / max(tput['amb'], 1e-9):.2f}×, p50 {pct(seq[w], 50):.2f} ms; "
            f"the watcher's CPU {watcher_cpu:.1f} s in {time.monotonic() - started:.0f} s",
            f"unwatched, same rounds: p50 {a50:.2f} ms",
            "no regression",
        )
    figs.write()


def proxy_rows(
    checked: dict[str, tuple[str, bool, str]],
    seq: dict[str, list[float]],
    ttfb: dict[str, tuple[list[float], list[int]]],
    gem: dict[str, tuple[list[float], list[int]]],
    tput: dict[str, float],
    big: dict[str, list[float]],
    gaps: dict[str, tuple[float, float]],
    prev: dict[str, str],
) -> list[tuple[str, str, str, str, str]]:
    """The README's rows (id, measure, figure, baseline, target) from the targets' checks."""

    def value(key: str) -> str:
        return checked[key][0].replace("x", "×")

    def target(key: str) -> str:
        text, ok = checked[key][2], checked[key][1]
        return f"{text.replace('<=', '≤').replace('>=', '≥').replace('x', '×')} ({figures.met(ok)})"

    reads = {name: statistics.median(ttfb[name][1]) for name in ("amb", "direct")}
    gem_reads = {name: statistics.median(gem[name][1]) for name in ("amb", "direct")}
    mitm_big = pct(big["mitm"], 50) - pct(big["direct"], 50)
    return [
        (
            "recording-p50",
            "recording cost over bare mitmproxy, non-streaming p50 ([overhead](docs/recording.md#overhead))",
            value("p50"),
            f"bare mitmproxy (`mitmdump`): p50 {pct(seq['mitm'], 50):.2f} ms{prev.get('p50', '')}",
            target("p50"),
        ),
        (
            "p99",
            "added p99 over direct calls",
            value("p99"),
            f"direct: {pct(seq['direct'], 99):.2f} ms",
            target("p99"),
        ),
        (
            "ttfc",
            "added time to first chunk of a 50-chunk stream; client reads per stream",
            f"{value('ttfc')}; {reads['amb']:.0f} reads",
            f"direct: {reads['direct']:.0f} reads (one per upstream chunk)",
            f"{target('ttfc')}; as many reads ({figures.met(checked['reads'][1])})",
        ),
        (
            "gemini-ttfc",
            "Gemini stream (`streamGenerateContent`, SSE): added time to first chunk; reads",
            f"{pct(gem['amb'][0], 50) - pct(gem['direct'][0], 50):.2f} ms; {gem_reads['amb']:.0f} reads",
            f"direct: {gem_reads['direct']:.0f} reads",
            target("gemini"),
        ),
        (
            "big",
            "a 5 MB request: time added over direct",
            f"{value('big')} bare mitmproxy's",
            f"bare mitmproxy: +{mitm_big:.1f} ms{prev.get('big', '')}",
            target("big"),
        ),
        (
            "gap",
            "a stream's longest gap between chunks beside 5 MB uploads",
            f"{value('gap')} streaming mitmproxy's",
            f"mitmproxy, streaming only: {gaps['mitm_stream'][1]:.1f} ms",
            target("gap"),
        ),
        (
            "calls",
            "calls/s, 16 concurrent clients, median of 3 rounds",
            f"{value('calls')} bare mitmproxy's ({tput['amb']:.0f}/s)",
            f"bare mitmproxy: {tput['mitm']:.0f}/s{prev.get('calls', '')}",
            target("calls"),
        ),
    ]


if __name__ == "__main__":
    main()
