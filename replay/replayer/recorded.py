"""A recorded run's model calls, and the rules that pick which one answers a new request.

Match modes (``amb replay serve --match``, docs/viewer.md): ``strict`` (byte for byte the next
call), ``canonical`` (equal as sorted JSON without the ``VOLATILE`` fields, any call not yet
served), ``sequence`` (the n-th request of an API gets its n-th call) and ``lenient`` (canonical
after masking ``LENIENT_PATTERNS``, else the closest of the next ``LENIENT_WINDOW`` calls). Each
recorded call is served once, first in first out, as mitmproxy's server replay does.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

import duckdb

from replay.read import require_runs
from schemas.blob import digest
from schemas.codec import canonical_json
from schemas.errors import AmbError
from schemas.providers import CONVERSATION_KEYS, api_title
from schemas.untrusted_json import loads_untrusted

MODES = ("strict", "canonical", "sequence", "lenient")
VOLATILE = ("stream_options", "user", "metadata", "service_tier", "store")
LENIENT_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<uuid>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(r"/tmp/[\w./-]+"), "<tmp>"),
    (re.compile(r"\b(?:call|toolu|fc)_[A-Za-z0-9_-]+"), "<tool-id>"),
    (re.compile(r"\b[a-z][a-z0-9_]*?_\d{13}_\d+\b"), "<tool-id>"),  # a client's own: the Gemini CLI's
    (re.compile(r"(\\?\"elapsed_s\\?\":\s*)[0-9.]+"), r"\1<n>"),
    (
        re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\s+\d{1,2}\s+\d{1,2}:\d{2}\b"),
        "<date>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b"), "<clock>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|sec|seconds)\b"), "<duration>"),
]
LENIENT_WINDOW = 8
LENIENT_MIN_RATIO = 0.6


class ReplayError(AmbError):
    """The run cannot be replayed (no such run, no recorded calls, a missing blob)."""


@dataclass
class RecordedCall:
    index: int
    key: str
    call_id: str
    api: str
    provider: str
    stream: bool
    status: int | None
    ok: bool
    error: str | None
    partial: bool
    request_blob: str | None
    response_blob: str | None
    response_media: str
    ttfb_ms: float | None
    latency_ms: float | None
    model: str | None = None
    """The model the request named (``requested_model``; the recorded ``model`` when it has none)."""
    body: bytes = b""
    canonical: str = ""
    lenient: str = ""


def canonical_text(body: bytes) -> str:
    """Sorted-key compact JSON without the volatile fields; the raw text when it is not JSON."""
    try:
        obj = loads_untrusted(body)
        if isinstance(obj, dict):
            obj = {k: v for k, v in obj.items() if k not in VOLATILE}
        return canonical_json(obj).decode()
    except ValueError:  # not JSON, or JSON whose text is not Unicode (a lone surrogate)
        return body.decode("utf-8", "replace")


def lenient_text(canonical: str) -> str:
    for pattern, repl in LENIENT_PATTERNS:
        canonical = pattern.sub(repl, canonical)
    return canonical


def load_calls(con: duckdb.DuckDBPyConnection, blobs: Any, run_id: str) -> list[RecordedCall]:
    """Every model call of ``run_id`` in recorded order, with its request body read from the blobs."""
    require_runs(con, [run_id])
    rows = con.execute(
        """SELECT source, seq, payload->>'$.call_id', payload->>'$.api', payload->>'$.provider',
                  coalesce(TRY_CAST(payload->>'$.stream' AS BOOLEAN), false),
                  TRY_CAST(payload->>'$.status' AS INTEGER),
                  coalesce(TRY_CAST(payload->>'$.ok' AS BOOLEAN), true), payload->>'$.error',
                  coalesce(TRY_CAST(payload->>'$.partial' AS BOOLEAN), false), payload->>'$.request.blob',
                  payload->>'$.response.blob',
                  coalesce(payload->>'$.response.media_type', 'application/json'),
                  TRY_CAST(payload->>'$.ttfb_ms' AS DOUBLE), TRY_CAST(payload->>'$.latency_ms' AS DOUBLE),
                  coalesce(payload->>'$.requested_model', payload->>'$.model')
           FROM events WHERE run_id = ? AND kind = 'model_call.completed'
           ORDER BY coalesce(TRY_CAST(payload->>'$.started_ns' AS BIGINT), ts_ns), ts_ns, source, seq""",
        [run_id],
    ).fetchall()
    if not rows:
        raise ReplayError(f"run {run_id!r} made no model calls: there is nothing to replay")
    calls = []
    for i, r in enumerate(rows):
        call = RecordedCall(i, f"{r[0]}:{r[1]}", *r[2:])
        if call.request_blob:
            call.body = blobs.get(call.request_blob)
        call.canonical = canonical_text(call.body)
        call.lenient = lenient_text(call.canonical)
        calls.append(call)
    return calls


@dataclass
class Outcome:
    call: RecordedCall | None
    how: str
    """``exact``, ``canonical``, ``sequence``, ``lenient``, ``closest`` or ``miss``."""
    why: str = ""


@dataclass
class Matcher:
    calls: list[RecordedCall]
    mode: str
    served: list[bool] = field(default_factory=list)
    misses: list[dict[str, Any]] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ReplayError(f"--match must be one of {', '.join(MODES)}")
        self.served = [False] * len(self.calls)

    def pending(self, api: str) -> list[RecordedCall]:
        return [c for c in self.calls if not self.served[c.index] and c.api == api]

    def take(self, api: str, body: bytes, stream: bool) -> Outcome:
        with self.lock:
            out = self._match(api, body)
            if out.call is not None and out.call.stream != stream:
                want = "a stream" if stream else "a whole response"
                out = Outcome(
                    None,
                    "miss",
                    f"the request asks for {want}, but the matching recorded call {out.call.key} was "
                    f"{'streamed' if out.call.stream else 'not streamed'}",
                )
            if out.call is not None:
                self.served[out.call.index] = True
            else:
                self.misses.append({"request": len(self.log), "api": api, "why": out.why})
            self.log.append({"api": api, "how": out.how, "call": out.call.key if out.call else None})
            return out

    def _match(self, api: str, body: bytes) -> Outcome:
        todo = self.pending(api)
        if not todo and not any(c.api == api for c in self.calls):
            has = ", ".join(sorted({api_title(c.api) for c in self.calls}))
            return Outcome(
                None, "miss", f"this recording has no calls to the {api_title(api)} (it has: {has})"
            )
        if not todo:
            return Outcome(None, "miss", f"every recorded {api} call has been served already")
        if self.mode == "sequence":
            return Outcome(todo[0], "sequence")
        if self.mode == "strict":
            if todo[0].request_blob == digest(body):
                return Outcome(todo[0], "exact")
            return Outcome(None, "miss", self._explain(todo[0], body, "byte for byte"))
        canon = canonical_text(body)
        if self.mode == "canonical":
            if same := next((c for c in todo if c.canonical == canon), None):
                return Outcome(same, "canonical")
            return Outcome(None, "miss", self._explain(todo[0], body, "as canonical JSON"))
        loose = lenient_text(canon)
        if same := next((c for c in todo if c.lenient == loose), None):
            return Outcome(same, "lenient")
        best, ratio = None, 0.0
        for c in todo[:LENIENT_WINDOW]:
            r = similarity(c.lenient, loose)
            if r > ratio:
                best, ratio = c, r
        if best is not None and ratio >= LENIENT_MIN_RATIO:
            return Outcome(best, "closest", f"similarity {ratio:.2f}")
        return Outcome(None, "miss", self._explain(todo[0], body, "even leniently"))

    def _explain(self, expected: RecordedCall, body: bytes, how: str) -> str:
        """Which recorded call was expected and where the request first differs from it."""
        where = first_difference(expected.body, body)
        return (
            f"the request does not match the next recorded call {expected.key} ({expected.call_id}) "
            f"{how}: {where}"
        )

    def summary(self) -> dict[str, Any]:
        with self.lock:
            return {
                "mode": self.mode,
                "recorded": len(self.calls),
                "served": sum(self.served),
                "requests": len(self.log),
                "misses": list(self.misses),
                "unserved": [c.key for c in self.calls if not self.served[c.index]],
            }


def similarity(a: str, b: str) -> float:
    """How alike two masked request bodies are: the share of their conversation's items (messages,
    input items, contents) that are equal, position by position; for bodies that are not JSON,
    whether they are equal. Cheap on purpose: a character-level ratio over 100 KB conversations
    would take seconds per request."""
    try:
        ja, jb = loads_untrusted(a), loads_untrusted(b)
    except ValueError:
        return 1.0 if a == b else 0.0
    if not (isinstance(ja, dict) and isinstance(jb, dict)):
        return 1.0 if ja == jb else 0.0
    key = next((k for k in CONVERSATION_KEYS if k in ja), "")
    la, lb = ja.get(key), jb.get(key)
    if not (isinstance(la, list) and isinstance(lb, list)) or not (la or lb):
        return 1.0 if ja == jb else 0.0
    same = sum(1 for x, y in zip(la, lb, strict=False) if x == y)
    rest_a = {k: v for k, v in ja.items() if k != key}
    rest_b = {k: v for k, v in jb.items() if k != key}
    return same / max(len(la), len(lb)) * (1.0 if rest_a == rest_b else 0.9)


def first_difference(recorded: bytes, live: bytes) -> str:
    """A short description of where two request bodies first differ (message index when JSON)."""
    try:
        a, b = loads_untrusted(recorded), loads_untrusted(live)
    except ValueError:
        a = b = None
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) == b.get(k):
                continue
            if k in CONVERSATION_KEYS and isinstance(a.get(k), list) and isinstance(b.get(k), list):
                la, lb = a[k], b[k]
                for i, (x, y) in enumerate(zip(la, lb, strict=False)):
                    if x != y:
                        return f"{k}[{i}] differs"
                return f"{k} has {len(lb)} items where {len(la)} were recorded"
            return f"field {k!r} differs"
        return "the bytes differ (same JSON)"
    n = next(
        (i for i, (x, y) in enumerate(zip(recorded, live, strict=False)) if x != y),
        min(len(recorded), len(live)),
    )
    return f"the bytes differ from offset {n}"
