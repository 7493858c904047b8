"""The mitmproxy addon: tees traffic into ``Sink`` and keeps credentials in custody.

Hook order per flow: ``request`` (route a reverse endpoint's request to its upstream: ``_route``;
inject the real key, refuse if recording is broken, and queue the request's parse and blob: see
``_queue_request``) → ``responseheaders`` (switch streaming on: mitmproxy buffers whole
responses otherwise, which would turn time-to-first-token into the length of the whole stream)
→ ``response`` or ``error`` (hand the facts to the sink; for model calls, wait until they are
durable and fail closed if not).
``done`` writes flows still in flight as partial records (mitmproxy calls it before their
``error`` hooks at shutdown).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.net.http import url

from recorder.budget import WAIT, Budget, Refusal
from recorder.proxy import calls
from recorder.proxy import refusal as refusal_mod
from recorder.proxy import sink as sink_mod
from recorder.proxy.custody import REDACTED
from recorder.proxy.gate import BLOCKED_KEY, BLOCKED_MARK
from recorder.proxy.sink import NETWORK_BODY_CAP, CallFacts, Sink
from recorder.proxy.upstreams import Upstream
from schemas.events import NetworkRequest
from schemas.providers.result import loads

log = logging.getLogger(__name__)
KEY = "amb"
WS_KEY = "amb-ws"
TERMINAL_TYPES = ("response.completed", "response.failed", "response.incomplete", "error")
TERMINAL_WS = tuple(t.encode() for t in TERMINAL_TYPES)
RECORDER_ERROR = "amb_recorder_error"
ANSWERED_WAIT_S = 10.0
"""The longest a call's record waits for the records of the calls its request may answer."""


@dataclass
class _Flow:
    api: calls.Api | None
    started_ns: int
    t0: float
    prepared: Future[Any] | None = None
    """Future of the request's blob and parse, started as soon as the request arrived."""
    pending: tuple[bytes, str | None] | None = None
    """A small request's body and encoding, until ``_prepare_small`` has taken care of them."""
    url: str | None = None
    retries: int = 0
    content_type: str = ""
    chunks: list[bytes] = field(default_factory=list)
    first_byte: float | None = None
    streamed: bool = False
    recorded: bool = False
    # non-model traffic: running hash and the body while under the cap
    sha: Any = None
    size: int = 0
    kept: bytearray | None = None
    call_id: str | None = None
    """Set for a model call carried over a WebSocket (one flow, many calls)."""
    blocked: str | None = None
    """Why the gate refused the flow (it was answered 403; nothing was sent)."""
    upstream: str | None = None
    """The upstream whose reverse endpoint the request came in on."""
    refused: str | None = None
    """Why the run's budget refused the call (it was answered by the proxy; nothing was sent)."""


class Recorder:
    def __init__(self, sink: Sink):
        self.sink = sink
        self.routes: dict[str, Upstream] = {}
        """Reverse endpoint (mode spec) → the upstream its requests go to (set by ``ProxyServer``)."""
        self.live: dict[str, http.HTTPFlow] = {}
        self.ws_live: dict[str, http.HTTPFlow] = {}
        """WebSocket flows with a model call in progress (their state is in ``flow.metadata``)."""
        self.persisting = 0
        """Hooks waiting for the sink right now (shutdown waits for them to finish)."""

    def request(self, flow: http.HTTPFlow) -> Coroutine[Any, Any, None] | None:
        req = flow.request
        upstream = self.routes.get(flow.client_conn.proxy_mode.full_spec)
        if upstream is not None:
            _route(req, upstream)
        api = calls.classify(req.method, req.path)
        st = flow.metadata[KEY] = _Flow(
            api=api,
            started_ns=time.time_ns(),
            t0=req.timestamp_start or time.time(),
            upstream=upstream.name if upstream is not None else None,
        )
        blocked = flow.metadata.get(BLOCKED_KEY)
        if blocked is not None:  # the gate answered 403: recorded as a refused network request
            st.api, st.blocked = None, blocked
            self.live[flow.id] = flow
            return None
        if self.sink.broken:
            flow.response = refusal_mod.amb_error(
                503,
                f"amb-record cannot persist the recording ({self.sink.broken}); "
                "refusing to forward unrecorded traffic",
                RECORDER_ERROR,
            )
            st.recorded = True
            return None
        budget = self.sink.budget
        if api is not None and budget is not None:
            verdict = budget.try_admit(flow.id)
            if verdict == WAIT:  # decided once calls in flight settle: mitmproxy awaits what we return
                return self._admit_later(flow, st, budget)
            if isinstance(verdict, Refusal):
                self._refuse(flow, st, verdict)
                return None
        self._forward(flow, st)
        return None

    def _forward(self, flow: http.HTTPFlow, st: _Flow) -> None:
        req = flow.request
        custody = self.sink.custody
        custody.inject(req.host, req.port, req.headers)
        if "?" in req.path:
            req.path = custody.inject_query(req.host, req.port, req.path)
        if st.api is not None:
            self._queue_request(flow, st)
        self.live[flow.id] = flow

    async def _admit_later(self, flow: http.HTTPFlow, st: _Flow, budget: Budget) -> None:
        refusal = await budget.admit(flow.id)
        if refusal is None:
            self._forward(flow, st)
        else:
            self._refuse(flow, st, refusal)

    def _refuse(self, flow: http.HTTPFlow, st: _Flow, refusal: Refusal) -> None:
        """Answer a model call over budget with its provider's quota error; nothing goes upstream.
        The refusal is recorded as a failed model call (``budget_exceeded: ...``) with its request."""
        st.refused = refusal.message
        # Why the ignore[union-attr] below: only model calls (api set) ask for admission.
        flow.response = refusal_mod.response(st.api.provider, refusal.message)  # type: ignore[union-attr]
        self._queue_request(flow, st)
        self.live[flow.id] = flow

    def _queue_request(self, flow: http.HTTPFlow, st: _Flow) -> None:
        """Start the request's share of the recording so it overlaps the upstream's work: a large
        body on a worker thread, a small one on the event loop's next turn (mitmproxy sends the
        request upstream as soon as this hook returns), with no thread hand-off."""
        req = flow.request
        raw = req.raw_content or b""
        encoding = req.headers.get("content-encoding")
        if len(raw) > sink_mod.EAGER_PREPARE_MIN:
            # Why the ignore[arg-type] below: only model calls (api set) reach the request preparation.
            st.prepared = self.sink.prepare_request(st.api, raw, encoding)  # type: ignore[arg-type]
            self._request_facts(flow, st)
        else:
            st.prepared, st.pending = Future(), (raw, encoding)
            asyncio.get_running_loop().call_soon(self._prepare_small, flow, st)

    def _prepare_small(self, flow: http.HTTPFlow, st: _Flow) -> None:
        if st.pending is None:
            return  # already done on demand: the flow ended first
        (raw, encoding), st.pending = st.pending, None
        self._request_facts(flow, st)
        # Why the ignore[arg-type] below: as above, a model call: api is set.
        self.sink.prepare_into(st.prepared, st.api, raw, encoding)  # type: ignore[arg-type]

    def _request_facts(self, flow: http.HTTPFlow, st: _Flow) -> None:
        req = flow.request
        st.url = _url(req.scheme, req.host_header, req.host, req.port, req.path)
        st.retries = _int(req.headers.get("x-stainless-retry-count"))

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        """A CONNECT the gate refused (the only CONNECTs answered with an error here)."""
        blocked = flow.metadata.get(BLOCKED_KEY)
        if blocked is None:
            return
        req = flow.request
        status = flow.response.status_code if flow.response else None
        seen = NetworkRequest(
            method=req.method,
            host=req.host,
            port=req.port,
            started_ns=time.time_ns(),
            status=status,
            blocked=blocked,
        )
        self.sink.record_network(seen)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        st: _Flow | None = flow.metadata.get(KEY)
        if st is None or st.recorded or flow.response is None or st.blocked or st.refused:
            return
        ctype = st.content_type = flow.response.headers.get("content-type", "")
        if st.api is not None:
            if not ("text/event-stream" in ctype or st.api.streams_by_path):
                return
        elif flow.response.status_code == 101:
            return
        else:
            st.sha, st.kept = hashlib.sha256(), bytearray()
        st.streamed = True

        def tee(chunk: bytes) -> bytes:
            # Runs once per upstream chunk: a model call keeps a reference, other traffic a hash and
            # the body while under the cap; the bytes pass on unchanged.
            if chunk:
                if st.first_byte is None:
                    st.first_byte = time.time()
                if st.sha is None:
                    st.chunks.append(chunk)
                    return chunk
                st.sha.update(chunk)
                st.size += len(chunk)
                if st.kept is not None:
                    if len(st.kept) + len(chunk) <= NETWORK_BODY_CAP:
                        st.kept += chunk
                    else:
                        st.kept = None
            return chunk

        flow.response.stream = tee

    async def response(self, flow: http.HTTPFlow) -> None:
        try:
            await self._persist(flow, None)
        except Exception as e:  # fail closed: the client must not get an unrecorded answer
            log.error("amb-record: cannot persist %s: %s", flow.request.pretty_url, e)
            if flow.metadata[KEY].streamed:
                flow.kill()  # the stream ends without its terminator: the client sees an error
            else:
                flow.response = refusal_mod.amb_error(
                    502, f"amb-record could not persist this call: {e}", RECORDER_ERROR
                )

    async def error(self, flow: http.HTTPFlow) -> None:
        msg = flow.error.msg if flow.error else "unknown error"
        st: _Flow | None = flow.metadata.get(KEY)
        if st is not None and BLOCKED_MARK in msg:  # the gate refused the connection itself (server_connect)
            st.blocked = msg.split(BLOCKED_MARK, 1)[1]
        try:
            await self._persist(flow, _classify_error(msg, flow.response is not None))
        except Exception as e:
            log.error("amb-record: cannot persist failed flow %s: %s", flow.request.pretty_url, e)

    async def _persist(self, flow: http.HTTPFlow, error: str | None) -> None:
        """Record a flow that ended (once); returns when its record is written."""
        st: _Flow | None = flow.metadata.get(KEY)
        self.live.pop(flow.id, None)
        if st is None or st.recorded:
            return
        st.recorded = True
        self.persisting += 1
        try:
            if st.api is not None:
                facts = self._call_facts(flow, st, error)
                # Wait for the request's worker here, then write inline: one hand-off, not two.
                await self._answered_calls_first(facts)
                await _settled(self.sink.record_call(facts))
            else:
                await _settled(self.sink.record_network(*self._net_facts(flow, st, error)))
        finally:
            self.persisting -= 1

    # -- the same APIs over a WebSocket (the Responses API as the Codex CLI carries it) ----------

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        api = calls.classify_websocket(flow.request.path)
        if api is None or flow.websocket is None:
            return
        msg = flow.websocket.messages[-1]
        if msg.from_client:
            if b"response.create" not in msg.content:
                return
            data = loads(msg.content)
            if not (isinstance(data, dict) and data.get("type") == "response.create"):
                return
            previous: _Flow | None = flow.metadata.get(WS_KEY)
            if previous is not None:  # a new request before the last one ended: keep what we have
                await self._record_ws(flow, previous, "websocket_superseded")
            n = flow.metadata.get(WS_KEY + "-n", 0) + 1
            flow.metadata[WS_KEY + "-n"] = n
            handshake: _Flow | None = flow.metadata.get(KEY)
            st = _Flow(
                api=api,
                started_ns=time.time_ns(),
                t0=time.time(),
                streamed=True,
                call_id=f"{flow.id}-{n}",
                upstream=handshake.upstream if handshake is not None else None,
            )
            st.prepared = self.sink.prepare_request(api, msg.content, None)
            budget = self.sink.budget
            refusal = await budget.admit(f"{flow.id}-{n}") if budget is not None else None
            if refusal is not None:  # the request never reaches the upstream; the client gets an error
                msg.drop()
                refused = refusal_mod.websocket_error(refusal.message)
                ctx.master.commands.call("inject.websocket", flow, True, refused)
                await self._record_ws(flow, st, f"budget_exceeded: {refusal.message}")
                return
            flow.metadata[WS_KEY] = st
            self.ws_live[flow.id] = flow
            return
        current: _Flow | None = flow.metadata.get(WS_KEY)
        if current is None:
            return
        st = current
        if st.first_byte is None:
            st.first_byte = time.time()
        # Stored as SSE data frames, one per message, so the stream parser reads both carriages.
        st.chunks.append(b"data: " + msg.content + b"\n\n")
        if any(t in msg.content for t in TERMINAL_WS):
            event = loads(msg.content)
            if isinstance(event, dict) and event.get("type") in TERMINAL_TYPES:
                if not await self._record_ws(flow, st, None):
                    msg.drop()  # fail closed: the client never sees the end of an unrecorded answer
                    flow.kill()

    async def websocket_end(self, flow: http.HTTPFlow) -> None:
        st = flow.metadata.get(WS_KEY)
        if st is not None:
            reason = flow.websocket.close_reason if flow.websocket else None
            await self._record_ws(flow, st, "websocket_closed" + (f": {reason}" if reason else ""))

    async def _record_ws(self, flow: http.HTTPFlow, st: _Flow, error: str | None) -> bool:
        flow.metadata.pop(WS_KEY, None)
        self.ws_live.pop(flow.id, None)
        if st.recorded:
            return True
        st.recorded = True
        self.persisting += 1
        try:
            facts = self._ws_facts(flow, st, error)
            await self._answered_calls_first(facts)
            await _settled(self.sink.record_call(facts))
            return True
        except Exception as e:
            log.error("amb-record: cannot persist a WebSocket model call: %s", e)
            return False
        finally:
            self.persisting -= 1

    async def _answered_calls_first(self, facts: CallFacts) -> None:
        """Let the records of the calls this one's request may answer be written first (see
        ``Sink.writing_before``): their request is done, so each is only local work. Bounded all
        the same, and checked again after each wait (one of them may have waited for its own)."""
        deadline = time.monotonic() + ANSWERED_WAIT_S
        if not facts.request.done():
            await asyncio.wait([asyncio.wrap_future(facts.request)])
        if facts.request.exception() is not None:
            return  # recorded without its request's facts (the write says why)
        while (waits := self.sink.writing_before(facts)) and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait([asyncio.wrap_future(w) for w in waits], timeout=left)

    def _ws_facts(self, flow: http.HTTPFlow, st: _Flow, error: str | None) -> CallFacts:
        req = flow.request
        scheme = "wss" if req.scheme == "https" else "ws"
        return CallFacts(
            call_id=st.call_id or flow.id,
            # Why the ignore[arg-type] below: a model call, so api (and url) are set.
            api=st.api,  # type: ignore[arg-type]
            url=f"{scheme}://{req.pretty_host}:{req.port}{req.path.split('?', 1)[0]}",
            request=st.prepared,  # type: ignore[arg-type]  # set when the response.create was seen
            started_ns=st.started_ns,
            streamed=True,
            status=flow.response.status_code if flow.response else None,
            response_chunks=st.chunks,
            content_type="text/event-stream",
            ttfb_ms=(st.first_byte - st.t0) * 1000 if st.first_byte else None,
            latency_ms=(time.time() - st.t0) * 1000,
            error=error,
            partial=error is not None and not error.startswith("budget_exceeded"),
            upstream=st.upstream,
            refused=error is not None and error.startswith("budget_exceeded"),
        )

    def done(self) -> None:
        # mitmproxy calls done() before in-flight flows get error(): save them now as partial.
        for flow in list(self.live.values()):
            st: _Flow | None = flow.metadata.get(KEY)
            if st is None or st.recorded:
                continue
            st.recorded = True
            try:
                if st.api is not None:
                    self.sink.record_call_now(self._call_facts(flow, st, "recorder_shutdown"))
                else:
                    self.sink.record_network(*self._net_facts(flow, st, "recorder_shutdown")).result()
            except Exception as e:
                log.error("amb-record: cannot persist in-flight flow at shutdown: %s", e)
        self.live.clear()
        for flow in list(self.ws_live.values()):
            st = flow.metadata.pop(WS_KEY, None)
            if st is not None and not st.recorded:
                st.recorded = True
                try:
                    self.sink.record_call_now(self._ws_facts(flow, st, "recorder_shutdown"))
                except Exception as e:
                    log.error("amb-record: cannot persist in-flight WebSocket call at shutdown: %s", e)
        self.ws_live.clear()

    def _call_facts(self, flow: http.HTTPFlow, st: _Flow, error: str | None = None) -> CallFacts:
        req, resp = flow.request, flow.response
        now = time.time()
        if st.prepared is None:  # never queued (refused, or the flow failed before its request hook)
            st.prepared, st.pending = Future(), (req.raw_content or b"", req.headers.get("content-encoding"))
        self._prepare_small(flow, st)  # if the flow ended before the loop's next turn
        if st.url is None:
            self._request_facts(flow, st)
        facts = CallFacts(
            call_id=flow.id,
            # Why the ignore[arg-type] below: a model call, so api (and url) are set.
            api=st.api,  # type: ignore[arg-type]
            url=st.url,  # type: ignore[arg-type]
            request=st.prepared,
            started_ns=st.started_ns,
            streamed=st.streamed,
            latency_ms=(now - st.t0) * 1000,
            error=error,
            partial=error is not None and resp is not None,
            retries=st.retries,
            upstream=st.upstream,
        )
        if st.refused is not None:
            facts.refused = True
            if error is None:
                facts.error, facts.partial = f"budget_exceeded: {st.refused}", False
        if resp is not None:
            facts.status = resp.status_code
            facts.response_encoding = resp.headers.get("content-encoding")
            facts.content_type = st.content_type if st.content_type else resp.headers.get("content-type", "")
            if st.streamed:
                facts.response_chunks = st.chunks
                first = st.first_byte
            else:
                facts.response_chunks = [resp.raw_content or b""]
                first = resp.timestamp_start
            if first is not None:
                facts.ttfb_ms = (first - st.t0) * 1000
        return facts

    def _net_facts(
        self, flow: http.HTTPFlow, st: _Flow, error: str | None = None
    ) -> tuple[NetworkRequest, bytes, bytes | None]:
        """The request as seen, its body, and its response's body (None when over the cap)."""
        req, resp = flow.request, flow.response
        status = sha = kept = None
        size = 0
        if resp is not None:
            status = resp.status_code
            if st.sha is not None:
                size, sha = st.size, st.sha.hexdigest()
                kept = bytes(st.kept) if st.kept is not None else None
            else:
                body = resp.raw_content or b""
                size, sha = len(body), hashlib.sha256(body).hexdigest()
                kept = body if len(body) <= NETWORK_BODY_CAP else None
        seen = NetworkRequest(
            method=req.method,
            scheme=req.scheme,
            host=req.pretty_host,
            port=req.port,
            path=req.path,
            status=status,
            response_bytes=size,
            started_ns=st.started_ns,
            duration_ms=(time.time() - st.t0) * 1000,
            response_sha256="sha256:" + sha if sha else None,
            error=error,
            blocked=st.blocked,
        )
        return seen, req.raw_content or b"", kept


async def _settled(fut: Any) -> Any:
    """The Future's result; no trip through the event loop when it is already done (inline writes)."""
    if fut.done():
        return fut.result()
    return await asyncio.wrap_future(fut)


def _route(req: http.Request, upstream: Upstream) -> None:
    """Send a request that came in on ``upstream``'s reverse endpoint to that upstream, its path
    mapped onto the upstream's base path (``/v1/chat/completions`` → ``/api/v1/chat/completions``).

    Each upstream's endpoint is a reverse proxy to a placeholder target (mitmproxy would merge two
    endpoints with the same target); the real scheme, host and port are set here, before anything
    connects (``connection_strategy`` is lazy)."""
    # Through ``req.data``: the ``host``/``port`` setters re-encode with IDNA and rewrite headers
    # on every call, several times slower.
    data = req.data
    data.scheme = upstream.scheme.encode()
    data.host, data.port = upstream.host, upstream.port
    if req.is_http2 or req.is_http3:
        data.authority = upstream.host_header.encode()
    else:
        data.authority = b""  # an absolute-form request line (an agent's own URL) goes out in origin form
        data.headers["Host"] = upstream.host_header
    data.path = upstream.upstream_path(req.path).encode("utf-8", "surrogateescape")


_QUERY_KEY = re.compile(r"(?<=[?&])key=[^&]*")


@functools.lru_cache(maxsize=256)
def _url(scheme: str, authority: str | None, host: str, port: int, path: str) -> str:
    """The URL called, with the value of a ``key`` query parameter (Gemini's API key) masked.
    Cached: ``pretty_host`` parses the Host header (with IDNA) on every call."""
    if authority:
        host = url.parse_authority(authority, check=False)[0]
    if "key=" in path:
        path = _QUERY_KEY.sub("key=" + REDACTED, path)
    return f"{scheme}://{host}:{port}{path}"


def _classify_error(msg: str, had_response: bool) -> str:
    low = msg.lower()
    if "client disconnected" in low or "client closed" in low:
        return "client_disconnected"
    return f"{'upstream_reset' if had_response else 'upstream_unreachable'}: {msg}"


def _int(value: str | None) -> int:
    try:
        return int(value) if value else 0
    except ValueError:
        return 0
