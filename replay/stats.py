"""``amb store stats``: what a store takes on disk, and what it holds, per area, table and run.

Two figures everywhere: **on disk**, the blocks the file system gave each file (``st_blocks * 512``,
as ``du`` counts), and **content**, the bytes the files hold (``st_size``; for tables, their values
as text). Files are measured by walking each area and grouped by suffix, whatever the blob layout.
A table's disk figure is its distinct storage blocks times the block size (small segments can share
a block, so tables may add up to more than the file). Blobs are shared between runs and may be
packed, so their on-disk bytes are given for the store as a whole.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import duckdb

from replay.manifest import HAS_BLOB_SQL
from replay.store import DB_NAME

_REF_PATTERN = r'"blob":"sha256:[0-9a-f]{64}"[^{}]*?"size":\d+'
"""A whole BlobRef inside a payload, up to its size."""
_HEX_NAME = re.compile(r"^[0-9a-f]{2,}$")


def _file_kind(path: Path) -> str:
    """A file's group inside its area: its suffixes (``.spool.zst``), or ``blob`` for a loose blob."""
    name = path.name
    if _HEX_NAME.match(name):
        return "blob"
    suffix = "".join(path.suffixes[-2:]) if len(path.suffixes) > 1 else path.suffix
    return suffix or "(no suffix)"


def _disk(st: os.stat_result) -> int:
    return st.st_blocks * 512


def measure_tree(root: Path) -> dict[str, Any]:
    """Files under ``root`` (symlinks not followed): totals and per kind of file."""
    out: dict[str, Any] = {"files": 0, "disk_bytes": 0, "content_bytes": 0, "dirs_disk_bytes": 0, "kinds": {}}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        out["dirs_disk_bytes"] += _disk(os.lstat(dirpath))
        for name in filenames:
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            kind = out["kinds"].setdefault(
                _file_kind(path), {"files": 0, "disk_bytes": 0, "content_bytes": 0}
            )
            for bucket in (out, kind):
                _count(bucket, st)
        dirnames.sort()
    out["disk_bytes"] += out["dirs_disk_bytes"]
    return out


def _count(bucket: dict[str, Any], st: os.stat_result) -> None:
    bucket["files"] += 1
    bucket["disk_bytes"] += _disk(st)
    bucket["content_bytes"] += st.st_size


def measure_database(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"files": 0, "disk_bytes": 0, "content_bytes": 0}
    for name in (DB_NAME, DB_NAME + ".wal"):
        try:
            st = os.stat(root / name)
        except FileNotFoundError:
            continue
        _count(out, st)
    return out


def measure_tables(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, int]]:
    block_size = con.execute(
        "SELECT block_size FROM pragma_database_size() WHERE database_name = current_database()"
    ).fetchall()
    size = int(block_size[0][0]) if block_size else 262144
    tables = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND NOT temporary ORDER BY table_name"
    ).fetchall()
    out = {}
    for (table,) in tables:
        quoted = '"' + table.replace('"', '""') + '"'
        counts = con.execute(f"SELECT count(*), sum(strlen(COLUMNS(*)::VARCHAR)) FROM {quoted}").fetchall()[0]
        rows, content = counts[0], sum(int(n or 0) for n in counts[1:])
        blocks = con.execute(
            "SELECT count(DISTINCT block_id) FROM pragma_storage_info(?) WHERE persistent AND block_id >= 0",
            [table],
        ).fetchall()[0][0]
        out[table] = {"rows": int(rows), "disk_bytes": int(blocks) * size, "content_bytes": int(content)}
    return out


def measure_runs(con: duckdb.DuckDBPyConnection, root: Path) -> list[dict[str, Any]]:
    events = con.execute(
        """
        SELECT run_id, count(*),
               sum(strlen(payload) + strlen(kind) + strlen(run_id) + strlen(source) + 140) AS body_bytes
        FROM events GROUP BY run_id ORDER BY run_id
        """
    ).fetchall()
    # A BlobRef's canonical JSON is {"blob":"sha256:...","media_type":"...","size":N}.
    blobs = {
        run: (n, size)
        for run, n, size in con.execute(
            f"""
            SELECT run_id, count(*), coalesce(sum(size), 0) FROM (
                SELECT DISTINCT run_id, regexp_extract(m, 'sha256:[0-9a-f]{{64}}') AS b,
                       regexp_extract(m, '"size":(\\d+)$', 1)::BIGINT AS size
                FROM (SELECT run_id, unnest(regexp_extract_all(payload, '{_REF_PATTERN}')) AS m
                      FROM events WHERE {HAS_BLOB_SQL}))
            GROUP BY run_id
            """
        ).fetchall()
    }
    out = []
    for run_id, n, body_bytes in events:
        spool = measure_tree(root / "spool" / run_id)
        refs, blob_bytes = blobs.get(run_id, (0, 0))
        out.append(
            {
                "run_id": run_id,
                "events": int(n),
                "event_bytes": int(body_bytes or 0),
                "spool_disk_bytes": spool["disk_bytes"],
                "spool_content_bytes": spool["content_bytes"],
                "blob_refs": int(refs),
                "blob_bytes": int(blob_bytes),
            }
        )
    return out


def stats(con: duckdb.DuckDBPyConnection, root: Path, per_run: bool = True) -> dict[str, Any]:
    database = measure_database(root)
    blobs = measure_tree(root / "blobs")
    spools = measure_tree(root / "spool")
    n_events = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
    total_disk = database["disk_bytes"] + blobs["disk_bytes"] + spools["disk_bytes"]
    total_content = database["content_bytes"] + blobs["content_bytes"] + spools["content_bytes"]
    out: dict[str, Any] = {
        "events": int(n_events),
        "total": {
            "disk_bytes": total_disk,
            "content_bytes": total_content,
            "disk_bytes_per_event": round(total_disk / n_events, 1) if n_events else None,
        },
        "database": {**database, "tables": measure_tables(con)},
        "blobs": blobs,
        "spools": spools,
    }
    if per_run:
        out["runs"] = measure_runs(con, root)
    return out
