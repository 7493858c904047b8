"""Stores as amb wrote them before packs: one loose zlib file (or chunk list) per blob."""

from __future__ import annotations

import os
import shutil
import zlib

from schemas import blobcodec, packstore
from schemas.blobstore import COMPRESSION_LEVEL, DECODE_LIMIT, BlobStore


def explode(blobs: BlobStore) -> int:
    """Turn every packed blob into the loose file an old store had for it, then drop the packs."""
    blobs.close()
    n = 0
    for pack in blobs.pack_files():
        for r in packstore.scan(pack):
            path = blobs.root / r.hexd[:2] / r.hexd[2:]
            if path.exists():
                continue
            if r.codec == blobcodec.CHUNKS:
                stored = bytes(r.stored)
            else:  # a delta became its whole content: old stores had no deltas
                content = (
                    blobs.get("sha256:" + r.hexd)
                    if r.codec == blobcodec.DELTA
                    else blobcodec.decode(r.codec, r.stored, DECODE_LIMIT, r.hexd)
                )
                stored = zlib.compress(content, COMPRESSION_LEVEL)
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(stored)
            os.chmod(path, 0o444)
            n += 1
    shutil.rmtree(blobs.packs_dir)
    blobs.forget()
    return n


def plain_payloads(root: os.PathLike[str] | str) -> None:
    """Give a store's ``events`` the payload column of stores made before
    ``core.m006_payload_zstd`` (DuckDB's default string compression), and mark that migration
    as not applied, so the next ``Store.open`` migrates it."""
    import duckdb

    con = duckdb.connect(os.path.join(root, "amb.duckdb"))
    try:
        cols = con.execute(
            "SELECT column_name, data_type, is_nullable FROM duckdb_columns() "
            "WHERE schema_name = 'main' AND table_name = 'events' ORDER BY column_index"
        ).fetchall()
        ddl = ", ".join(f'"{n}" {t}' + ("" if nullable else " NOT NULL") for n, t, nullable in cols)
        con.execute("BEGIN")
        con.execute(f"CREATE TABLE events_plain ({ddl})")
        con.execute("INSERT INTO events_plain SELECT * FROM events ORDER BY run_id, source, seq")
        con.execute("DROP TABLE events")
        con.execute("ALTER TABLE events_plain RENAME TO events")
        con.execute("DELETE FROM _amb_migrations WHERE name = 'core.m006_payload_zstd'")
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
    finally:
        con.close()
