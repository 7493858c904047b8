"""The judge-call cache: every LLM judge exchange, keyed by the hash of its full input.

key = sha256 of the canonical JSON of {messages (with the full evidence), model, settings}, where
settings are the ones that change a reply (temperature, seed, max_tokens, JSON mode, prompt
version). Replies that are a function of that input (a verdict, a parse failure, an out-of-range
value, a refusal) are cached; transport failures (timeout, connection, HTTP error) are recorded but
never served from the cache, so the next rescore asks again.

The cache is loaded from the store's ``judge_calls`` table before a batch and new records are
written back in one bulk insert after it (``scorer.ledger``); during the batch it is a dict guarded by
a lock, shared by the scoring threads.
"""

from __future__ import annotations

import threading
from typing import Any

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


class JudgeCache:
    def __init__(self, entries: dict[str, CallRecord] | None = None):
        self._entries = dict(entries or {})
        self._new: list[CallRecord] = []
        self._lock = threading.Lock()

    def get(self, key: str) -> CallRecord | None:
        with self._lock:
            return self._entries.get(key)

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self._new.append(record)
            if record.cacheable:
                self._entries[record.key] = slim(record)

    def fill_answers(self, answers: dict[str, str]) -> None:
        """Give the loaded records their stored answers (key -> the ``answer`` column)."""
        with self._lock:
            for key, answer in answers.items():
                if key in self._entries:
                    self._entries[key] = msgspec.structs.replace(self._entries[key], answer=answer)

    def drain(self) -> list[CallRecord]:
        """The records added since the last drain (to be written to the store)."""
        with self._lock:
            new, self._new = self._new, []
            return new

    def __len__(self) -> int:
        return len(self._entries)
