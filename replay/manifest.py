"""Run manifests: a small summary of a finished run to anchor outside the store.

Whoever can write the DuckDB file can rebuild a hash chain after editing it, so each finished run
gets a manifest (last hash, last seq and event count per source, the number of blob references)
that ``amb manifest RUN`` prints for keeping elsewhere and ``amb verify --manifest FILE`` checks.
A source's last hash commits to every blob reference, so the references' count is a cross-check.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import msgspec

from schemas.codec import canonical_digest

FORMAT = "amb-manifest/1"

BLOB_REF_SQL = r"""regexp_extract_all(payload, '"blob":"(sha256:[0-9a-f]{64})"', 1)"""
"""Every stored blob reference in a payload (BlobRef's field is named ``blob``)."""

BLOB_MARK = '"blob":"sha256:'
HAS_BLOB_SQL = f"""contains(payload, '{BLOB_MARK}')"""
"""A cheap pre-filter for BLOB_REF_SQL (most events carry no blob)."""


def compute_many(
    con: duckdb.DuckDBPyConnection, run_ids: list[str], blob_refs: dict[str, int] | None = None
) -> dict[str, dict[str, Any]]:
    """The manifests of ``run_ids`` as the store holds them now (runs with no events are absent).

    Set-based: two grouped queries whatever the number of runs. ``blob_refs`` gives runs' blob
    reference counts already known (ingest counts them in the spools it loads whole); the payloads
    of only the other runs are read for theirs."""
    if not run_ids:
        return {}
    wanted = set(run_ids)
    known = {r: n for r, n in (blob_refs or {}).items() if r in wanted}
    import pyarrow as pa  # here: the commands that import this module and list runs need no Arrow

    con.register("_amb_manifest_runs", pa.table({"run_id": run_ids}))
    con.register("_amb_manifest_count", pa.table({"run_id": [r for r in run_ids if r not in known]}))
    try:
        sources = con.execute(
            """
            SELECT e.run_id, e.source, count(*), max(e.seq), arg_max(e.hash, e.seq)
            FROM events e SEMI JOIN _amb_manifest_runs r ON r.run_id = e.run_id
            GROUP BY ALL ORDER BY 1, 2
            """
        ).fetchall()
        counted = dict(
            con.execute(
                f"""
                SELECT e.run_id,
                    sum((strlen(payload) - strlen(replace(payload, '{BLOB_MARK}', ''))) // {len(BLOB_MARK)})
                FROM events e SEMI JOIN _amb_manifest_count r ON r.run_id = e.run_id
                GROUP BY ALL
                """
            ).fetchall()
            if len(known) < len(run_ids)
            else []
        )
    finally:
        con.unregister("_amb_manifest_runs")
        con.unregister("_amb_manifest_count")
    return assemble(sources, {**counted, **known})


def assemble(
    sources: list[tuple[str, str, int, int, str]], blob_refs: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """The manifests from each (run, source)'s event count, last seq and last hash and each run's
    number of blob references (``amb verify`` counts them in its own scan of the events)."""
    out: dict[str, dict[str, Any]] = {}
    for run_id, source, n, last, h in sources:
        m = out.setdefault(run_id, {"format": FORMAT, "run_id": run_id, "sources": {}, "events": 0})
        m["sources"][source] = {"events": n, "last_seq": last, "last_hash": h}
        m["events"] += n
    for run_id, m in out.items():
        m["blob_refs"] = int(blob_refs.get(run_id) or 0)
        # Ids, hex digests and whole numbers only: the same bytes as the json.dumps(sort_keys=True)
        # form that hashed the manifests stored so far (tests/replay/test_verify.py checks it).
        m["manifest_hash"] = canonical_digest(m)
    return out


def compute(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any] | None:
    return compute_many(con, [run_id]).get(run_id)


def write_manifests(store: Any, run_ids: list[str], blob_refs: dict[str, int] | None = None) -> None:
    """Record a manifest for each finished run that has none yet (``blob_refs``: see ``compute_many``)."""
    con = store.con
    if not run_ids:
        return
    import pyarrow as pa

    con.register("_amb_candidates", pa.table({"run_id": run_ids}))
    try:
        todo = [
            r[0]
            for r in con.execute(
                """
                SELECT DISTINCT e.run_id FROM events e SEMI JOIN _amb_candidates c ON c.run_id = e.run_id
                WHERE e.kind = 'run.finished' AND e.run_id NOT IN (SELECT run_id FROM manifests)
                ORDER BY 1
                """
            ).fetchall()
        ]
    finally:
        con.unregister("_amb_candidates")
    manifests = compute_many(con, todo, blob_refs)
    if manifests:
        con.register(
            "_amb_new_manifests",
            pa.table(
                {
                    "run_id": list(manifests),
                    "manifest": [json.dumps(m, sort_keys=True) for m in manifests.values()],
                }
            ),
        )
        con.execute("INSERT INTO manifests SELECT run_id, manifest, now() FROM _amb_new_manifests")
        con.unregister("_amb_new_manifests")


def stored(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any] | None:
    rows = con.execute("SELECT manifest FROM manifests WHERE run_id = ?", [run_id]).fetchall()
    return json.loads(rows[0][0]) if rows else None


class _AnchoredSource(msgspec.Struct):
    events: int
    last_seq: int
    last_hash: str


class _Anchored(msgspec.Struct):
    """What ``differences`` reads of a manifest kept elsewhere (other fields are left as they are)."""

    run_id: str
    sources: dict[str, _AnchoredSource]
    events: int | None = None
    blob_refs: int | None = None


def check_anchored(manifests: list[Any], where: str) -> list[dict[str, Any]]:
    """Manifests kept outside the store (``amb verify --manifest``), each checked to be one (an object
    with a run id and its sources' counts and last hashes): ``ValueError`` naming the first that is
    not, by its number in ``where``."""
    for n, m in enumerate(manifests, 1):
        try:
            msgspec.convert(m, _Anchored)
        except msgspec.ValidationError as e:
            raise ValueError(f"{where}: manifest {n} is not a run's manifest: {e}") from None
    return manifests


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
    for key in ("events", "blob_refs"):
        if actual.get(key) != expected.get(key):
            out.append(f"{key} is {actual.get(key)}, anchored {expected.get(key)}")
    return out
