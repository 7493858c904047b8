"""Reading a run's shim spool back in tests (straight from the spool file, no store needed)."""

from __future__ import annotations

from pathlib import Path

from recorder.spool import spool_path
from schemas.codec import decode_event
from schemas.frames import scan


def shim_events(store: Path, run_id: str, source: str = "shim") -> list:
    path = spool_path(store, run_id, source)
    result = scan(path.read_bytes(), str(path))
    assert result.tail is None, f"torn spool tail: {result.tail}"
    return [decode_event(bytes(b)) for b in result.bodies]


def payloads(events: list, kind: str) -> list:
    return [e.payload for e in events if e.kind == kind]
