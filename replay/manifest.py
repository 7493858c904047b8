"""Run manifests: a small summary of a finished run to anchor outside the store.

A hash chain proves order and content only to someone who trusts the last link: whoever can write
the DuckDB file can rebuild a chain after editing it. So each finished run gets a manifest (last
hash and event count per source, the number of blobs and a digest over their addresses) that
``amb manifest RUN`` prints for keeping elsewhere (a ticket, a signed commit, a second machine),
and ``amb verify --manifest FILE`` checks the store against that anchored copy.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import duckdb

FORMAT = "amb-manifest/1"

BLOB_REF_SQL = r"""regexp_extract_all(payload, '"blob":"(sha256:[0-9a-f]{64})"', 1)"""
"""Every stored blob reference in a payload (BlobRef's field is named ``blob``)."""


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def compute(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any] | None:
    """The manifest of ``run_id`` as the store holds it now (None if the run has no events)."""
    rows = con.execute(
        """
        SELECT source, count(*), max(seq), arg_max(hash, seq)
        FROM events WHERE run_id = ? GROUP BY source ORDER BY source
        """,
        [run_id],
    ).fetchall()
    if not rows:
        return None
    blobs = [
        r[0]
        for r in con.execute(
            f"SELECT DISTINCT unnest({BLOB_REF_SQL}) AS b FROM events WHERE run_id = ? ORDER BY b",
            [run_id],
        ).fetchall()
    ]
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "run_id": run_id,
        "sources": {s: {"events": n, "last_seq": last, "last_hash": h} for s, n, last, h in rows},
        "events": sum(r[1] for r in rows),
        "blobs": len(blobs),
        "blobs_digest": "sha256:" + hashlib.sha256("\n".join(blobs).encode()).hexdigest(),
    }
    manifest["manifest_hash"] = "sha256:" + hashlib.sha256(_canonical(manifest)).hexdigest()
    return manifest


def write_manifests(store: Any, run_ids: list[str]) -> None:
    """Record a manifest for each finished run that has none yet."""
    con = store.con
    for run_id in run_ids:
        finished = con.execute(
            "SELECT 1 FROM events WHERE run_id = ? AND kind = 'run.finished' LIMIT 1", [run_id]
        ).fetchone()
        exists = con.execute("SELECT 1 FROM manifests WHERE run_id = ?", [run_id]).fetchone()
        if finished and not exists:
            manifest = compute(con, run_id)
            con.execute("INSERT INTO manifests VALUES (?, ?, now())", [run_id, json.dumps(manifest, sort_keys=True)])


def stored(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any] | None:
    row = con.execute("SELECT manifest FROM manifests WHERE run_id = ?", [run_id]).fetchone()
    return json.loads(row[0]) if row else None


def differences(expected: dict[str, Any], actual: dict[str, Any] | None) -> list[str]:
    """Human-readable differences between an anchored manifest and the store's current one."""
    if actual is None:
        return [f"run {expected.get('run_id')} has no events in the store"]
    out = []
    for source, want in sorted(expected.get("sources", {}).items()):
        have = actual["sources"].get(source)
        if have is None:
            out.append(f"source {source}: missing from the store")
            continue
        for key in ("events", "last_seq", "last_hash"):
            if have[key] != want[key]:
                out.append(f"source {source}: {key} is {have[key]}, anchored {want[key]}")
    for source in sorted(set(actual["sources"]) - set(expected.get("sources", {}))):
        out.append(f"source {source}: not in the anchored manifest")
    for key in ("blobs", "blobs_digest"):
        if actual.get(key) != expected.get(key):
            out.append(f"{key} is {actual.get(key)}, anchored {expected.get(key)}")
    return out
