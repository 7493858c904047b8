"""The replay endpoint: answers model API requests with a recorded run's responses.

It speaks the paths the agent's SDK uses (``.../chat/completions``, ``.../responses``,
``.../messages``, and ``.../models``), accepts any key (none is needed: nothing goes upstream), and
answers each request with the recorded response chosen by the matcher:

- the recorded status and body; a stream is re-emitted event by event (one chunk per SSE event),
  with ``--timing original`` paced as recorded: the first event after the recorded time to first
  byte, the rest spread evenly over the remaining latency (the proxy records those two times, not
  each chunk's); ``--timing fast`` sends at once;
- a recorded failure is replayed as one: an HTTP error with its recorded body, a stream cut short
  (``partial``) is cut at the same byte, and a call that got no response at all is answered by
  closing the connection;
- a request that matches nothing gets a 400 in the API's own error shape (``replay_miss``, naming
  the recorded call that was expected and where the request differs), and is reported.
"""

from __future__ import annotations

import gzip
import json
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from replay.replayer.recorded import Matcher, RecordedCall, ReplayError, load_calls
from replay.store import Store
from schemas.blobstore import BlobStore
from schemas.untrusted_json import loads_untrusted

TIMINGS = ("original", "fast")
MAX_BODY = 256 * 1024 * 1024


def api_of(path: str) -> str | None:
    p = path.split("?", 1)[0].rstrip("/")
    if p.endswith("/chat/completions"):
        return "chat.completions"
    if p.endswith("/responses"):
        return "responses"
    if p.endswith("/messages"):
        return "messages"
    return None


def decode_body(raw: bytes, encoding: str | None) -> bytes:
    """The request body as the SDK meant it (the recorded request blobs are decoded bodies)."""
    for enc in reversed([e.strip().lower() for e in (encoding or "").split(",") if e.strip()]):
        if enc == "gzip":
            raw = gzip.decompress(raw)
        elif enc == "deflate":
            raw = zlib.decompress(raw)
        elif enc == "br":
            import brotli

            raw = brotli.decompress(raw)
        elif enc == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        elif enc != "identity":
            raise ValueError(f"unknown content-encoding {enc!r}")
    return raw


def sse_events(body: bytes) -> list[bytes]:
    """A recorded stream cut into its events (each with its blank-line terminator)."""
    out: list[bytes] = []
    start = 0
    body = body.replace(b"\r\n", b"\n")
    while True:
        end = body.find(b"\n\n", start)
        if end < 0:
            if start < len(body):
                out.append(body[start:])
            return out
        out.append(body[start : end + 2])
        start = end + 2


class Replayer:
    """What the request threads share: the matcher, the blobs, the timing, and who hears of misses."""

    def __init__(
        self,
        calls: list[RecordedCall],
        blobs: BlobStore,
        mode: str,
        timing: str,
        report: Callable[[str], None] | None = None,
    ):
        if timing not in TIMINGS:
            raise ReplayError(f"--timing must be one of {', '.join(TIMINGS)}")
        self.matcher = Matcher(calls, mode)
        self.blobs = blobs
        self.timing = timing
        self.report = report or (lambda line: None)
        self.models = sorted({c.provider for c in calls})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "amb-replay"
    # A stream is re-emitted one small event per write: each must leave when written.
    disable_nagle_algorithm = True
    replayer: Replayer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, api: str | None, status: int, message: str, code: str) -> None:
        if api == "messages":
            body: dict[str, Any] = {"type": "error", "error": {"type": code, "message": message}}
        else:
            body = {"error": {"message": message, "type": code, "code": code, "param": None}}
        self._send_json(status, body, {"x-amb-replay": "miss"})

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/").endswith("/models"):
            self._send_json(200, {"object": "list", "data": []})
            return
        self._error(None, 404, f"the replay endpoint has no route {self.path[:200]}", "not_found")

    def do_POST(self) -> None:
        api = api_of(self.path)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._error(api, 400, "the request needs a Content-Length below 256 MiB", "invalid_request_error")
            return
        raw = self.rfile.read(length)
        if api is None:
            self._error(None, 404, f"the replay endpoint has no route {self.path[:200]}", "not_found")
            return
        try:
            body = decode_body(raw, self.headers.get("Content-Encoding"))
        except (ValueError, OSError, zlib.error) as e:
            self._error(api, 400, f"cannot decode the request body: {e}", "invalid_request_error")
            return
        try:
            stream = bool(loads_untrusted(body).get("stream"))
        except (ValueError, AttributeError):
            stream = False
        r = self.replayer
        out = r.matcher.take(api, body, stream)
        n = len(r.matcher.log)
        if out.call is None:
            r.report(f"request {n} ({api}): no match: {out.why}")
            self._error(api, 400, f"amb replay: {out.why}", "replay_miss")
            return
        call = out.call
        r.report(f"request {n} ({api}): served {call.key} ({out.how}{', ' + out.why if out.why else ''})")
        self._serve(call, out.how)

    def _serve(self, call: RecordedCall, how: str) -> None:
        r = self.replayer
        if call.status is None:
            # The recorded call got no response at all (reset, unreachable): neither does this one.
            self._abort()
            return
        data = r.blobs.get(call.response_blob) if call.response_blob else b""
        headers = {"x-amb-replay": how, "x-amb-replay-call": call.key}
        ttfb = (call.ttfb_ms or 0) / 1000 if r.timing == "original" else 0.0
        total = max((call.latency_ms or 0) / 1000, ttfb) if r.timing == "original" else 0.0
        if not call.stream or call.status >= 400 and not data.startswith(b"data:") and b"\ndata:" not in data:
            time.sleep(total)
            self.send_response(call.status)
            self.send_header("Content-Type", call.response_media)
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            return
        events = sse_events(data)
        time.sleep(ttfb)
        self.send_response(call.status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        gap = (total - ttfb) / max(len(events) - 1, 1)
        for i, ev in enumerate(events):
            if i:
                time.sleep(gap)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            self.wfile.flush()
        if call.partial:
            self._abort()
            return
        self.wfile.write(b"0\r\n\r\n")

    def _abort(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class ReplayServer:
    """The replay endpoint on a thread, on loopback: ``with ReplayServer(...) as s: s.url``."""

    def __init__(self, replayer: Replayer, host: str = "127.0.0.1", port: int = 0):
        self.replayer = replayer
        self.host = host
        handler = type("ReplayHandler", (Handler,), {"replayer": replayer})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="amb-replay", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server.server_port}"

    def __enter__(self) -> ReplayServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def open_replayer(
    store: Path, run_id: str, mode: str, timing: str, report: Callable[[str], None] | None = None
) -> Replayer:
    """Load ``run_id``'s calls from the store, then let go of the database (a recording made against
    the replay must be able to ingest into the same store)."""
    with Store.open(store, read_only=True, lock_timeout_s=30.0) as st:
        calls = load_calls(st.con, st.blobs, run_id)
        return Replayer(calls, st.blobs, mode, timing, report)


def stderr_reporter(prefix: str) -> Callable[[str], None]:
    def report(line: str) -> None:
        print(f"{prefix}{line}", file=sys.stderr, flush=True)

    return report
