"""The proxy's write side: request and response blobs, spool appends, the tool-call ledger.

A multi-MB body takes tens of ms to parse, hash, compress and write: inside a mitmproxy hook that
would stall every other stream, so large bodies go to worker threads (hashing and compression
release the GIL) and small ones are recorded on the event loop (``EAGER_PREPARE_MIN``, ``INLINE_MAX``).
A call is acknowledged once its blobs and event are written to the OS; a flusher thread fsyncs the
run's blob pack (``BlobWriter``), then the spool, every ``FLUSH_INTERVAL_S``. A failed write or fsync
marks the sink broken: the proxy refuses traffic from then on (docs/recording.md, "Failing closed").
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from recorder.budget import Budget
from recorder.proxy import calls
from recorder.proxy.blobwriter import BlobWriter
from recorder.proxy.custody import Custody
from recorder.proxy.ledger import Ledger
from recorder.spool import SpoolWriter, spool_path
from schemas.blob import BlobRef, digest
from schemas.blobpack import pack_path
from schemas.errors import AmbError
from schemas.events import (
    ModelCallCompleted,
    NetworkRequest,
    Payload,
    ToolCallRequested,
    ToolCallResult,
    Usage,
    kind_of,
)
from schemas.providers.result import Reassembled, RequestInfo, ToolResult

TOOL_OUTPUT_INLINE = 16 * 1024
"""Tool results longer than this go to a blob (``output_blob``) with the first part inline."""

NETWORK_BODY_CAP = 1024 * 1024
"""Non-model bodies above this are hashed, not stored."""

EAGER_PREPARE_MIN = 64 * 1024
"""Requests larger than this are prepared on a worker as soon as they arrive; smaller ones on the
event loop in its next turn, while the upstream works (no thread hand-off on the common path)."""

INLINE_MAX = 64 * 1024
"""A finished call whose response is at most this big (and whose request is prepared) is recorded
on the event loop: a few syscalls and a small parse cost less than two thread hand-offs under the
GIL. Larger ones go to the worker threads, so a 5 MB body never stalls other streams."""

FLUSH_INTERVAL_S = 0.02
"""How often the spool is fsync'd (the bound on what a power loss, not a crash, can take)."""


@dataclass
class CallFacts:
    """Everything the addon observed about one model call (raw bytes; parsing happens here)."""

    call_id: str
    api: calls.Api
    url: str
    request: Future[PreparedRequest]
    started_ns: int
    status: int | None = None
    response_chunks: list[bytes] = field(default_factory=list)
    response_encoding: str | None = None
    content_type: str = ""
    streamed: bool = False
    ttfb_ms: float | None = None
    latency_ms: float | None = None
    error: str | None = None
    partial: bool = False
    retries: int = 0
    upstream: str | None = None
    """The name of the upstream whose reverse endpoint the call came in on."""
    refused: bool = False
    """The run's budget refused the call: the proxy answered it, nothing was used."""
    written: Future[None] = field(default_factory=Future)
    """Settled once the call's record is written (or failed)."""


def _settle(fut: Future[Any], fn: Any, *args: Any) -> Future[Any]:
    """Run ``fn`` here and now, settling ``fut`` with its result (or exception)."""
    try:
        fut.set_result(fn(*args))
    except BaseException as e:  # noqa: BLE001 - handed to whoever awaits the Future
        fut.set_exception(e)
    return fut


@dataclass
class PreparedRequest:
    info: RequestInfo
    ref: BlobRef | None


class Sink:
    """One run's proxy spool + the shared blob store + the tool-call ledger."""

    def __init__(
        self, store: Path, run_id: str, custody: Custody, *, workers: int = 4, budget: Budget | None = None
    ):
        spool = spool_path(store, run_id, "proxy")
        self.blobs = BlobWriter(Path(store) / "blobs", pack_path(spool))
        self.spool = SpoolWriter(spool, run_id, "proxy", sync=False)
        self.custody = custody
        self.budget = budget
        self._last_request: BlobRef | None = None
        """The run's latest request body: the next one is stored as a delta against it."""
        self._last_response: BlobRef | None = None
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="amb-sink")
        self.counts: Counter[str] = Counter()
        self.broken: str | None = None
        """Set on the first persistence failure; from then on every call is refused."""
        self._ledger = threading.Lock()
        self.ledger = Ledger()
        """Tool-call ids and pairing; used, with the appends that follow, under ``_ledger``."""
        self._writing: list[CallFacts] = []
        """Calls handed to a worker whose record is not yet written (``writing_before``)."""
        self._busy = 0
        """Writes in progress (``_guard``): a call's tool events are appended just after its model_call."""
        self._settled = threading.Condition()
        self._closing = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="amb-sink-flush", daemon=True)
        self._flusher.start()

    def _flush_loop(self) -> None:
        while not self._closing.wait(FLUSH_INTERVAL_S):
            try:
                self.blobs.sync()  # blobs first: a durable event has durable blobs
                self.spool.flush()
            except (AmbError, OSError) as e:
                self.broken = self.broken or f"{type(e).__name__}: {e}"

    # -- submission (called on the event loop; cheap) -----------------------------------------

    def prepare_request(self, api: calls.Api, raw: bytes, encoding: str | None) -> Future[PreparedRequest]:
        """Parse and store a request body on a worker, overlapping the upstream's work."""
        return self.pool.submit(self._guard, self._prepare, api, raw, encoding)

    def prepare_into(
        self, fut: Future[PreparedRequest], api: calls.Api, raw: bytes, encoding: str | None
    ) -> None:
        """The same, here and now, settling ``fut`` (small bodies: cheaper than waking a worker)."""
        _settle(fut, self._guard, self._prepare, api, raw, encoding)

    def record_call(self, facts: CallFacts) -> Future[ModelCallCompleted]:
        if sum(map(len, facts.response_chunks)) <= INLINE_MAX and facts.request.done():
            return _settle(Future(), self._guard, self._write_call, facts)
        with self._settled:
            self._writing.append(facts)
        return self.pool.submit(self._guard, self._write_call, facts)

    def writing_before(self, facts: CallFacts) -> list[Future[None]]:
        """The records still being written that ``facts``' request may answer: calls whose request
        history its own extends (or any, when it names a previous response instead). A streamed
        answer reaches the client before its record is written, and the ledger can pair a result
        only with a call it has seen, so the addon lets these finish first. Needs the request
        prepared."""
        with self._settled:
            writing = [w for w in self._writing if w is not facts and not w.written.done()]
        if not writing:
            return []  # the usual case: no set of the history's links to build
        info = facts.request.result().info
        prefixes = set(info.chain[1:-1])
        waits = []
        for other in writing:
            if info.previous is None:
                done = other.request.done() and other.request.exception() is None
                theirs = other.request.result().info if done else None
                if theirs is not None and (not theirs.chain or theirs.chain[-1] not in prefixes):
                    continue
            waits.append(other.written)
        return waits

    def record_network(
        self, seen: NetworkRequest, request: bytes = b"", response: bytes | None = None
    ) -> Future[NetworkRequest]:
        """Record a request as ``seen`` (bodies apart); ``response`` is None when over the cap."""
        return self.pool.submit(self._guard, self._write_network, seen, request, response)

    def record_call_now(self, facts: CallFacts) -> None:
        """Synchronously (at shutdown the pool may already be draining)."""
        self._guard(self._write_call, facts)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no write is in progress; False if one still was after ``timeout`` seconds."""
        with self._settled:
            return self._settled.wait_for(lambda: self._busy == 0, timeout)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self._closing.set()
        self._flusher.join()
        self.blobs.close()  # materialises this run's blob pack into the store
        self.spool.close()

    # -- work (worker threads) -----------------------------------------------------------------

    def _guard(self, fn: Any, *args: Any) -> Any:
        with self._settled:
            self._busy += 1
        try:
            return fn(*args)
        except (AmbError, OSError) as e:
            self.broken = self.broken or f"{type(e).__name__}: {e}"
            raise
        finally:
            with self._settled:
                self._busy -= 1
                if not self._busy:
                    self._settled.notify_all()

    def _append(self, payload: Payload) -> int:
        written = self.spool.append(payload)
        self.counts[kind_of(type(payload))] += 1
        return written.seq

    def _blob(self, data: bytes, media_type: str) -> BlobRef:
        return self.blobs.put(self.custody.scrub(data), media_type)

    def _prepare(self, api: calls.Api, raw: bytes, encoding: str | None) -> PreparedRequest:
        body, decode_err = calls.decode(raw, encoding)
        # As for responses: a body that cannot be decoded (corrupt, or a compression bomb) is kept
        # as the wire bytes, whole, rather than as the part that decoded.
        media = "application/json"
        if decode_err is not None:
            body, media = raw, "application/octet-stream"
        body = self.custody.scrub(body)
        # The blob first, the parse second: decoding a large body's JSON holds the GIL, and by the
        # time the blob is written mitmproxy has usually finished forwarding the request upstream.
        # (Inline images and files are skimmed out of the parse: ``recorder.proxy.skim``.)
        # Stored as a delta against the run's previous request, which it usually extends (a race
        # between concurrent calls only picks another base: any base reads back right).
        ref = self.blobs.put(body, media, base=self._last_request) if body else None
        if ref is not None:
            self._last_request = ref
        return PreparedRequest(calls.parse_request(api, body), ref)

    def _write_call(self, f: CallFacts) -> ModelCallCompleted:
        try:
            return self._write_call_facts(f)
        finally:
            if self.budget is not None:
                # Every admitted call settles, even one whose record failed (its usage is then
                # unknown): a call waiting for admission must not wait forever. (A no-op once settled.)
                self.budget.settle(f.call_id, None, -1)
            with self._settled:
                if f in self._writing:
                    self._writing.remove(f)
            if not f.written.done():
                f.written.set_result(None)

    def _write_call_facts(self, f: CallFacts) -> ModelCallCompleted:
        prepared = f.request.result()
        info, request_ref = prepared.info, prepared.ref
        raw = b"".join(f.response_chunks)
        result, resp_body, decode_err = calls.parse_response(f.api, raw, f.response_encoding, f.content_type)
        response_ref = None
        if raw:
            media = f.content_type.split(";")[0].strip() or "application/octet-stream"
            # The decoded body is what the client's SDK read; if it cannot be decoded, keep the wire
            # bytes. A delta against the run's previous response: they share their structure.
            response_ref = self.blobs.put(
                self.custody.scrub(resp_body if decode_err is None else raw), media, base=self._last_response
            )
            self._last_response = response_ref
        error = f.error
        partial_flag = f.partial
        if error == "client_disconnected" and f.streamed and result.complete:
            # SDKs close the connection as soon as they read the stream's terminal event, which can
            # be before the upstream's end-of-body reaches the proxy: the client got everything.
            error, partial_flag = None, False
        if error is None and f.status is not None and f.status >= 400:
            error = f"http_{f.status}" + (f": {result.error}" if result.error else "")
        elif error is None and result.error:
            error = f"provider_error: {result.error}"
        partial = not f.refused and (
            partial_flag or (f.streamed and not result.complete and f.status is not None and f.status < 400)
        )
        if error is None and partial:
            error = "stream_incomplete"
        usage = result.usage
        if f.refused:
            usage = Usage()  # never sent: nothing to estimate
        elif usage is None:
            usage = calls.estimate_usage(info, result)
        # The ledger sees calls in the order their events are appended (which its ids depend on),
        # and a call's tool events follow its model call.
        with self._ledger:
            results = self.ledger.record(f.api.provider, info, result)
            event = self._append_call(f, info, result, request_ref, response_ref, error, partial, usage)
            self._write_tools(f.call_id, results, event.message.tool_calls)
        return event

    def _append_call(
        self,
        f: CallFacts,
        info: RequestInfo,
        result: Reassembled,
        request_ref: BlobRef | None,
        response_ref: BlobRef | None,
        error: str | None,
        partial: bool,
        usage: Usage,
    ) -> ModelCallCompleted:
        url = wire_text(f.url)
        requested_model = info.model or calls.model_in_path(url)
        event = ModelCallCompleted(
            call_id=f.call_id,
            provider=f.api.provider,
            api=f.api.api,
            model=result.model or requested_model,
            stream=f.streamed or info.stream,
            url=self.custody.scrub_text(url),
            status=f.status,
            ok=error is None,
            error=self.custody.scrub_text(error) if error else None,
            request=request_ref,
            response=response_ref,
            message=result.message(),
            stop_reason=result.stop_reason,
            usage=usage,
            started_ns=f.started_ns,
            ttfb_ms=f.ttfb_ms,
            latency_ms=f.latency_ms,
            retries=f.retries,
            partial=partial,
            requested_model=requested_model,
            served_model=result.model,
            upstream=f.upstream,
            cost_usd=result.cost,
        )
        seq = self._append(event)
        if self.budget is not None:
            self.budget.settle(f.call_id, event, seq)  # before the tool events: waiting calls go on
        return event

    def _write_tools(self, call_id: str, results: list[ToolResult], requested: list[Any]) -> None:
        """The results the ledger found new, and every call the response asked for (each is a new
        call: the ledger gave it an id no other call of the run has)."""
        for r in results:
            output = self.custody.scrub_text(r.output)
            blob = None
            if len(output) > TOOL_OUTPUT_INLINE:
                blob = self._blob(output.encode(), "text/plain")
                output = output[:TOOL_OUTPUT_INLINE]
            self._append(
                ToolCallResult(
                    tool_call_id=r.tool_call_id,
                    model_call_id=call_id,
                    name=r.name,
                    output=output,
                    output_blob=blob,
                    is_error=r.is_error,
                )
            )
        for t in requested:
            self._append(ToolCallRequested(t.id, t.name, t.arguments, model_call_id=call_id))

    def _write_network(self, seen: NetworkRequest, request: bytes, response: bytes | None) -> NetworkRequest:
        small = request and len(request) <= NETWORK_BODY_CAP
        event = msgspec.structs.replace(
            seen,
            method=wire_text(seen.method),
            host=wire_text(seen.host),
            path=self.custody.scrub_text(wire_text(seen.path)),
            request_bytes=len(request),
            request_sha256=digest(request) if request else None,
            request_body=self._blob(request, "application/octet-stream") if small else None,
            response_body=self._blob(response, "application/octet-stream") if response else None,
        )
        self._append(event)
        return event


_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def wire_text(text: str) -> str:
    """A request line's method, host, path or URL as recordable text. mitmproxy decodes the
    request line as UTF-8 with ``surrogateescape``, and an agent may send any byte there; an event
    holds UTF-8 only, so each byte that is not UTF-8 is written as a URL writes bytes (``%FF``)
    instead of making the event unwritable (which would fail the whole recording closed)."""
    return _NOT_UTF8.sub(lambda m: f"%{ord(m[0]) - 0xDC00:02X}", text)
