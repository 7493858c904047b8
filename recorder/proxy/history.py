"""A request's conversation as the tool-call ledger compares it (``recorder.proxy.ledger``).

A model API request carries its conversation so far as a list of items (Gemini's ``contents``, the
``messages`` of Chat Completions and Anthropic Messages, the Responses API's ``input``), chained by
digest: ``chain[k]`` stands for the first ``k`` items (their JSON, keys sorted), so two requests open
with the same ``k`` items exactly when their ``chain[k]`` agree. The digests are Python's own
``hash`` (keyed per process: an agent cannot aim for a collision), compared within the proxy that
made them and never stored.

Left out is what a client may change without changing the conversation: Anthropic's
``cache_control`` markers (each provider module's ``VOLATILE``), and inline binary data, because a
large request's parse has it skimmed out (``recorder.proxy.skim``, whose marker is new in every
body): a skimmed string, or one long enough to have been, under one of the skimmer's keys counts as
one placeholder.
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec

from recorder.proxy.skim import CARRIERS, MIN_SPAN
from schemas.codec import canonical_json

SEED = 0
"""``chain[0]``: no item yet."""

INLINE_KEYS = frozenset(k.strip(b'"').decode() for k in CARRIERS)
INLINE_MIN = MIN_SPAN // 4
"""An inline-data string of at least this many characters is a placeholder: the skimmer cuts
strings of ``MIN_SPAN`` bytes, and UTF-8 takes up to 4 bytes a character."""

_PLACEHOLDER = "<inline data>"

Sig = tuple[tuple[str, int], ...]
"""A model turn's tool calls as ``(name, digest of the arguments)``, in order."""


def _encode(obj: Any) -> bytes:
    try:
        return canonical_json(obj)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return repr(type(obj)).encode()


def _clean(obj: Any, volatile: tuple[str, ...], marker: str | None) -> Any:
    if isinstance(obj, dict):
        return {
            k: _PLACEHOLDER if _inline(k, v, marker) else _clean(v, volatile, marker)
            for k, v in obj.items()
            if k not in volatile
        }
    if isinstance(obj, list):
        return [_clean(v, volatile, marker) for v in obj]
    return obj


def _inline(key: str, value: Any, marker: str | None) -> bool:
    return (
        key in INLINE_KEYS
        and isinstance(value, str)
        and (len(value) >= INLINE_MIN or (marker is not None and value.startswith(marker)))
    )


def chain(items: list[Any], volatile: tuple[str, ...] = (), marker: str | None = None) -> list[int]:
    """``chain[k]`` for k = 0 .. len(items): a digest of the first k items, leaving out the keys
    ``volatile`` and inline data (``marker``: the skimmer's, when the body was skimmed)."""
    clues = [k.encode() for k in volatile] + ([marker.encode()] if marker else [])
    links = [SEED]
    for item in items:
        raw = _encode(item)
        if len(raw) >= INLINE_MIN or _holds(raw, clues):
            # Only then the slower walk; nested deeper than Python recurses, compared as it is.
            with contextlib.suppress(RecursionError):
                raw = _encode(_clean(item, volatile, marker))
        links.append(hash((links[-1], raw)))
    return links


def _holds(raw: bytes, clues: list[bytes]) -> bool:
    for clue in clues:  # a loop, not any(): it runs for every item of every request
        if clue in raw:
            return True
    return False


def signature(calls: list[tuple[str, str, Any]]) -> Sig:
    """A model turn's calls, given as (id, name, arguments), as the ledger compares them."""
    return tuple((name, args_digest(args)) for _, name, args in calls)


def args_digest(args: Any) -> int:
    """A tool call's arguments, the same whether given as JSON text (OpenAI) or as an object
    (Gemini, Anthropic), and whatever the order of their keys."""
    if isinstance(args, str):
        try:
            args = msgspec.json.decode(args)
        except (msgspec.DecodeError, RecursionError):
            return hash(("text", args))
    return hash(_encode(args))
