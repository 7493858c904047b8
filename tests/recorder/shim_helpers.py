"""Reading a run's shim spool back in tests (straight from the spool file, plain or compressed after
ingest, no store needed)."""

from __future__ import annotations

from pathlib import Path

from recorder.spool import spool_path
from replay.spools import read_bytes
from schemas.codec import decode_event
from schemas.frames import COMPRESSED_SUFFIX, scan


def shim_events(store: Path, run_id: str, source: str = "shim") -> list:
    path = spool_path(store, run_id, source)
    if not path.exists():  # the run was ingested, and its spool compressed (replay.spools)
        path = path.with_name(path.name + COMPRESSED_SUFFIX)
    result = scan(read_bytes(path), str(path))
    assert result.tail is None, f"torn spool tail: {result.tail}"
    return [decode_event(bytes(b)) for b in result.bodies]


def payloads(events: list, kind: str) -> list:
    return [e.payload for e in events if e.kind == kind]
