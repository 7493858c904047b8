"""Unsigned events for the scorer's tests, which fold events straight from payloads.

The scorer never checks the hash chain (``replay/verify`` does), so these events carry none.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from schemas.codec import Event
from schemas.events.base import kind_of


def unsigned_events(
    run_id: str, source: str, payloads: Iterable[Any], *, start_ns: int = 0, step_ns: int = 1
) -> list[Event]:
    """One event per payload, of ``source``, numbered from 0 and ``step_ns`` apart from ``start_ns``."""
    return [
        Event(
            run_id=run_id,
            source=source,
            seq=i,
            ts_ns=start_ns + step_ns * i,
            kind=kind_of(type(p)),
            v=1,
            payload=p,
            prev_hash="",
            hash="",
        )
        for i, p in enumerate(payloads)
    ]
