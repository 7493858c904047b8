"""The replay endpoint: answers model API requests with a recorded run's responses.

Every API of ``schemas.providers``, on the paths SDKs use, with any key (nothing goes upstream):
each request gets the call the matcher chose, as recorded (a stream as it was framed, a failure as
the same failure); a miss gets a 400 in the API's own error shape (``replay_miss``) and is
reported. Every error is JSON. docs/viewer.md has the details.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import brotli

from replay.replayer.recorded import Matcher, RecordedCall, ReplayError, load_calls
from replay.store import Store
from schemas import httpbase, providers
from schemas.blobstore import BlobStore
from schemas.providers.result import INVALID, NOT_FOUND, REPLAY_MISS
from schemas.providers.wire import ContentTooLarge, decode_content, frames
from schemas.untrusted_json import loads_untrusted

TIMINGS = ("original", "fast")
MAX_BODY = 256 * 1024 * 1024
MAX_WAIT_S = 600.0
"""The longest wait ``--timing original`` replays (a recorded time to first byte or latency): a
recording holds whatever its events say, and an answer hours away is a hung agent, not a replay."""
MODELS_PATH = re.compile(r"(?:^|/)models(?:/([^/]+))?$")
"""``…/models`` (the list) and ``…/models/MODEL`` (one), under any prefix."""


def wait_s(ms: float | None, cap: float) -> float:
    """A recorded time in milliseconds as a wait in seconds, at most ``cap``; a negative, NaN or
    missing one is no wait (``time.sleep`` raises on either, which dropped the connection)."""
    s = (ms or 0.0) / 1000
    return min(s, cap) if s > 0 else 0.0  # (NaN > 0 is false)


class Replayer:
    """What the request threads share: the matcher, the blobs, the timing, and who hears of misses."""

    def __init__(
        self,
        calls: list[RecordedCall],
        blobs: BlobStore,
        mode: str,
        timing: str,
        report: Callable[[str], None] | None = None,
        max_wait_s: float = MAX_WAIT_S,
    ):
        if timing not in TIMINGS:
            raise ReplayError(f"--timing must be one of {', '.join(TIMINGS)}")
        self.matcher = Matcher(calls, mode)
        self.blobs = blobs
        self.timing = timing
        self.max_wait_s = max_wait_s
        self.report = report or (lambda line: None)
        named: dict[str, str] = {}
        for c in calls:
            if c.model:
                named.setdefault(c.model, c.provider)
        self.models = dict(sorted(named.items()))
        """Every model the recording called, by name, with the provider that served it."""


class Handler(httpbase.Handler):
    server_version = "amb-replay"
    replayer: Replayer

    def error_json(self, status: int, message: str) -> Any:
        """In the shape of the provider whose client asks, when that is known (``providers.asked_by``);
        else a plain ``{"error": {"message", "type"}}``."""
        headers = getattr(self, "headers", None)
        provider = providers.asked_by(getattr(self, "path", ""), headers.keys() if headers else ())
        if provider is None:
            return {"error": {"message": message, "type": "invalid_request_error"}}
        return providers.error_body(provider, status, message, INVALID)

    def _error(self, provider: str | None, status: int, message: str, kind: str) -> None:
        body = providers.error_body(provider or "openai", status, message, kind)
        self.send_json(status, body, {"x-amb-replay": "miss"})

    def do_GET(self) -> None:
        provider = providers.asked_by(self.path, self.headers.keys()) or "openai"
        route = MODELS_PATH.search(self.path.split("?", 1)[0].rstrip("/"))
        if route is None:
            self._error(provider, 404, f"the replay endpoint has no route {self.path[:200]}", NOT_FOUND)
            return
        models = self.replayer.models
        if route.group(1) is None:
            self.send_json(200, providers.model_list(provider, models))
            return
        name = unquote(route.group(1))
        if name in models:
            self.send_json(200, providers.model_entry(provider, name, models[name]))
            return
        called = ", ".join(models) or "none that it named"
        message = f"model {name[:200]!r} is not in this recording (it called: {called})"
        self._error(provider, 404, message, NOT_FOUND)

    def do_POST(self) -> None:
        api = providers.classify("POST", self.path)
        if api is None:
            asker = providers.asked_by(self.path, self.headers.keys())
            self._error(asker, 404, f"the replay endpoint has no route {self.path[:200]}", NOT_FOUND)
            return
        try:
            raw = self.read_body(MAX_BODY)
        except httpbase.BodyRefused as e:
            self._error(api.provider, e.status, str(e), INVALID)
            return
        # The recorded request blobs are decoded bodies: so is what they are matched with.
        try:
            body, err = decode_content(raw, self.headers.get("Content-Encoding"), brotli, MAX_BODY)
        except ContentTooLarge as e:  # a compression bomb: kilobytes on the wire, gigabytes decoded
            self._error(api.provider, 413, f"cannot decode the request body: {e}", INVALID)
            return
        if err is not None:
            self._error(api.provider, 400, f"cannot decode the request body: {err}", INVALID)
            return
        try:
            stream = providers.wants_stream(api, loads_untrusted(body))
        except ValueError:
            stream = api.streams_by_path
        r = self.replayer
        out = r.matcher.take(api.api, body, stream)
        n = len(r.matcher.log)
        if out.call is None:
            r.report(f"request {n} ({api.api}): no match: {out.why}")
            self._error(api.provider, 400, f"amb replay: {out.why}", REPLAY_MISS)
            return
        call = out.call
        r.report(f"request {n} ({api.api}): served {call.key} ({out.how}{', ' + out.why if out.why else ''})")
        self._serve(call, out.how)

    def _serve(self, call: RecordedCall, how: str) -> None:
        r = self.replayer
        if call.status is None:
            # The recorded call got no response at all (reset, unreachable): neither does this one.
            self.abort()
            return
        data = r.blobs.get(call.response_blob) if call.response_blob else b""
        headers = {"x-amb-replay": how, "x-amb-replay-call": call.key}
        ttfb = total = 0.0
        if r.timing == "original":
            ttfb = wait_s(call.ttfb_ms, r.max_wait_s)
            total = max(wait_s(call.latency_ms, r.max_wait_s), ttfb)
        media, events = call.response_media, [data]
        if call.stream:
            media, data = providers.as_recorded_stream(call.api, media, data, self.path)
            events = frames(data, media)
        if len(events) <= 1 and (not call.stream or call.status >= 400):
            time.sleep(total)
            self.send(call.status, data, media, headers)
            return
        time.sleep(ttfb)
        self.send_chunks(call.status, media, events, headers, (total - ttfb) / max(len(events) - 1, 1))
        if call.partial:
            self.abort()
        else:
            self.end_chunks()


class ReplayServer(httpbase.Serving):
    """The replay endpoint on a thread, on loopback: ``with ReplayServer(...) as s: s.url``."""

    def __init__(self, replayer: Replayer, host: str = "127.0.0.1", port: int = 0):
        self.replayer = replayer
        names = httpbase.answered_names(host)  # (no DNS rebinding)
        super().__init__(Handler, host, port, replayer=replayer, allowed_hosts=names)


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
