"""The judge-call cache: every LLM judge exchange, keyed by the hash of its full input.

key = sha256 of the canonical JSON of {messages (with the full evidence), model, settings that change
a reply}. Replies that are a function of that input (a verdict, a parse failure, a refusal) are
cached; transport failures are recorded but never served from the cache, so the next rescore asks
again. Records are read from and written to the store's ``judge_calls`` table (``scorer.ledger``).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from typing import Any, Protocol

import msgspec

from schemas.codec import canonical_digest


class CallRecord(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    model: str
    settings: dict[str, Any]
    item: str
    run_id: str
    evidence_sha256: str
    request: dict[str, Any]
    """The request as sent, with the evidence text replaced by ``{{evidence:<sha256>}}`` (the
    evidence is stored once per run in the blob store under that digest)."""
    response: str
    """The raw response body as JSON text (the SDK's full parsed object), or the error."""
    reply_text: str
    value: float | None
    reason: str
    cited: list[str]
    unscored_reason: str | None
    cacheable: bool
    latency_ms: float
    codes: list[dict[str, Any]] | None = None
    """Error codes from the per-run codes call (item ``codes``); None for rubric items."""
    answer: str | None = None
    """A question's parsed answer (``LLMJudge.ask``) as canonical JSON; None for rubric items and
    codes, and when the reply gave no answer."""


def call_key(messages: list[dict[str, Any]], model: str, settings: dict[str, Any]) -> str:
    return canonical_digest({"messages": messages, "model": model, "settings": settings})


def slim(record: CallRecord) -> CallRecord:
    """The verdict part of a record (what a cache hit needs); the exchange itself stays in the store."""
    return msgspec.structs.replace(record, request={}, response="", reply_text="")


class KeySet:
    """Cache keys, 8 bytes each (a keyed digest of the key, sorted): ``in`` never says no for a key
    added, and says yes for one not added about once in 2**64 / size lookups."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._sorted = array("Q")
        self._new: set[int] = set()
        for key in keys:
            self.add(key)
        self.settle()

    def add(self, key: str) -> None:
        self._new.add(_short(key))

    def settle(self) -> None:
        """The keys added since sorted in."""
        if self._new:
            self._sorted.extend(self._new)
            self._new.clear()
            import numpy as np  # here: a command that never judges does not pay for numpy's import

            view = np.frombuffer(self._sorted, dtype=np.uint64)
            view.sort()
            del view  # (the array cannot grow while a view of it is held)

    def __contains__(self, key: str) -> bool:
        short = _short(key)
        i = bisect_left(self._sorted, short)
        return (i < len(self._sorted) and self._sorted[i] == short) or short in self._new


def _short(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(errors="replace"), digest_size=8).digest(), "big")


class StoredCalls(Protocol):
    """The cached calls a store holds, read as needed (``scorer.ledger.StoredCalls``)."""

    keys: KeySet

    def of_runs(self, run_ids: list[str]) -> dict[str, CallRecord]: ...

    def of_key(self, key: str) -> CallRecord | None: ...


class JudgeCache:
    """Cached verdicts by key. With ``stored``, the cache of a store too big to hold: the records of
    the runs being scored are loaded (``load_runs``), and any other key the store holds is read
    when it is asked for."""

    def __init__(self, entries: dict[str, CallRecord] | None = None, stored: StoredCalls | None = None):
        self._entries = dict(entries or {})
        self._new: list[CallRecord] = []
        self._lock = threading.Lock()
        self._stored = stored

    def get(self, key: str) -> CallRecord | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None and self._stored is not None and key in self._stored.keys:
                hit = self._stored.of_key(key)
                if hit is not None:
                    self._entries[key] = hit
            return hit

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self._new.append(record)
            if record.cacheable:
                self._entries[record.key] = slim(record)
                if self._stored is not None:
                    self._stored.keys.add(record.key)

    def load_runs(self, run_ids: list[str]) -> None:
        """Hold the stored records of these runs' calls in place of those held so far (records
        added since the last ``drain`` stay: they are not in the store yet)."""
        assert self._stored is not None
        with self._lock:
            self._stored.keys.settle()
            self._entries = self._stored.of_runs(run_ids) | {r.key: slim(r) for r in self._new if r.cacheable}

    def drain(self) -> list[CallRecord]:
        """The records added since the last drain (to be written to the store)."""
        with self._lock:
            new, self._new = self._new, []
            return new

    def __len__(self) -> int:
        return len(self._entries)
