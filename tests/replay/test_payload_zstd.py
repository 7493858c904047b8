"""The events table's payload column is compressed with zstd (``core.m006_payload_zstd``): in
a new store, and in an older store that the migration rebuilds with every row and column kept."""

from __future__ import annotations

import duckdb

from recorder.synthetic import generate_run
from replay.ingest import ingest
from replay.store import Store
from replay.verify import verify
from tests.fakes.old_store import plain_payloads


def _compression(con) -> set[str]:
    con.execute("CHECKPOINT")
    rows = con.execute(
        "SELECT DISTINCT compression FROM pragma_storage_info('events') WHERE column_name = 'payload'"
    ).fetchall()
    return {r[0] for r in rows} - {"Constant"}


def _columns(con) -> list[tuple]:
    return con.execute(
        "SELECT column_name, data_type, is_nullable FROM duckdb_columns() "
        "WHERE schema_name = 'main' AND table_name = 'events' ORDER BY column_index"
    ).fetchall()


def test_new_and_migrated_stores_keep_payloads_in_zstd(tmp_path):
    root = tmp_path / "store"
    for i in range(2):
        generate_run(root, f"run-{i}", seed=i, calls=6)
    ingest(root, spool_mode="keep")
    with Store.open(root) as st:
        assert _compression(st.con) == {"ZSTD"}
        columns = _columns(st.con)
        rows = st.con.execute("SELECT * FROM events ORDER BY run_id, source, seq").fetchall()
        calls = st.con.execute("SELECT * FROM model_calls ORDER BY call_id").fetchall()
    plain_payloads(root)  # an older store: its payloads as DuckDB's default compression left them
    con = duckdb.connect(str(root / "amb.duckdb"))
    assert "ZSTD" not in _compression(con)
    con.close()
    with Store.open(root) as st:  # opened: migrated
        assert _compression(st.con) == {"ZSTD"}
        assert _columns(st.con) == columns  # names, types, NOT NULL and order kept
        assert st.con.execute("SELECT * FROM events ORDER BY run_id, source, seq").fetchall() == rows
        assert st.con.execute("SELECT * FROM model_calls ORDER BY call_id").fetchall() == calls
        assert verify(st.con, st.blobs) == []
        # Tamper detection holds on the rebuilt table.
        st.con.execute(
            "UPDATE events SET payload = replace(payload, 'gpt', 'gpu') WHERE kind = 'run.started'"
        )
        assert [p.what for p in verify(st.con, st.blobs)][:1] == [
            "hash mismatch: the event was edited after it was recorded"
        ]
