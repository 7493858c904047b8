"""amb sql: read-only, no files, no network, no way to unlock."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from replay.store import DB_NAME, open_sql
from tests.tasks.helpers import digest_tree


@pytest.mark.parametrize(
    "query",
    [
        "COPY events TO 'out.csv'",
        "COPY (SELECT 1) TO '/tmp/amb-sql-test.parquet' (FORMAT parquet)",
        "ATTACH 'other.duckdb' AS o",
        "INSERT INTO events SELECT * FROM events LIMIT 1",
        "DELETE FROM events",
        "CREATE TABLE t AS SELECT 1",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM read_json_auto('/etc/os-release')",
        "SET enable_external_access = true",
        "INSTALL httpfs",
        "LOAD httpfs",
    ],
)
def test_refused(store, query):
    con = open_sql(store)
    with pytest.raises(duckdb.Error):
        con.execute(query)
    assert not (store / "out.csv").exists()


def _leave_a_wal(store: Path) -> None:
    """A write that stays in the WAL (no checkpoint on close), as a killed writer leaves it."""
    con = duckdb.connect(str(store / DB_NAME))
    con.execute("SET wal_autocheckpoint = '1TB'")
    con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.execute("CREATE TABLE wal_witness AS SELECT 42 AS answer")
    con.close()


# DuckDB with external access off still allows its own files (the database and its WAL) and its temp
# directory: each of these must be refused as well.
HOSTILE = [
    "COPY (SELECT 1) TO '{tmp}/x.csv'",
    "COPY (SELECT 1) TO '{store}/x.csv'",
    "SELECT * FROM read_text('{db}.wal')",
    "SELECT * FROM read_blob('{db}.wal')",
    "SELECT * FROM read_blob('{db}')",
    "SELECT * FROM read_text('{tmp}/planted.csv')",
    "SELECT * FROM read_csv('{tmp}/planted.csv')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_blob('file:///etc/passwd')",
    "SELECT * FROM glob('{store}/*')",
    "SELECT * FROM glob('{tmp}/*')",
    "ATTACH '{tmp}/other.duckdb' AS o",
    "ATTACH '{db}' AS again (READ_ONLY)",
    "EXPORT DATABASE '{tmp}/export'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "LOAD '{tmp}/x.duckdb_extension'",
    "SET enable_external_access = true",
    "SET allowed_directories = ['/']",
    "SET allowed_paths = ['/etc/passwd']",
    "SET temp_directory = '{tmp}'",
    "SET disabled_filesystems = ''",
    "SET lock_configuration = false",
    "PRAGMA enable_profiling = 'json'",
    "PRAGMA profiling_output = '{tmp}/profile.json'",
    "CALL enable_logging(storage = 'file', storage_config = {{'path': '{tmp}/log'}})",
    "SELECT * FROM duckdb_extensions()",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_no_file_access_at_all(store, query):
    _leave_a_wal(store)
    tmp = store / (DB_NAME + ".tmp")  # DuckDB's default temp directory, made as a spilling query makes it
    tmp.mkdir()
    (tmp / "planted.csv").write_text("a,b\n1,2\n")
    before = digest_tree(store)
    con = open_sql(store)
    assert con.execute("SELECT answer FROM wal_witness").fetchall() == [(42,)]  # the WAL was replayed
    with pytest.raises(duckdb.Error):
        con.execute(query.format(store=store, db=store / DB_NAME, tmp=tmp))
    # The sandbox holds on other cursors of the same connection (the viewer's) too.
    with pytest.raises(duckdb.Error):
        con.cursor().execute("SELECT * FROM read_text('/etc/passwd')")
    assert con.execute("SELECT count(*) FROM runs").fetchall() == [(3,)]
    con.close()
    assert digest_tree(store) == before


def test_views_answer_questions(store):
    con = open_sql(store)
    rows = con.execute(
        """SELECT r.run_id, count(m.call_id), sum(m.input_tokens), sum(m.n_tool_calls)
           FROM runs r JOIN model_calls m USING (run_id) GROUP BY 1 ORDER BY 1"""
    ).fetchall()
    assert [r[0] for r in rows] == ["run-0", "run-1", "run-2"]
    assert all(r[1] == 12 and r[2] > 0 and r[3] == 12 for r in rows)
    paired = con.execute(
        "SELECT count(*), count(answered_in) FROM tool_calls WHERE run_id = 'run-0'"
    ).fetchone()
    assert paired == (12, 11)  # the last call (submit_results) is never answered
    assert con.execute("SELECT count(*) FROM processes WHERE exit_code IS NULL").fetchall()[0][0] == 0
    # Every write of the plan was made by a process that wrote it (shim facts agree with each other).
    plan_writes = con.execute("SELECT count(*) FROM file_writes WHERE path = 'plan/plan.md'").fetchall()[0][0]
    plan_procs = con.execute("SELECT count(*) FROM processes WHERE cmd LIKE '%> plan/plan.md%'").fetchall()[
        0
    ][0]
    assert plan_writes == plan_procs >= 3


def test_the_viewer_reads_through_the_same_sandbox(store):
    from replay.web.db import SharedReader

    reader = SharedReader(store)
    try:
        with reader.cursor() as cur:
            assert cur.execute("SELECT count(*) FROM runs").fetchall() == [(3,)]
            with pytest.raises(duckdb.Error, match="disabled"):
                cur.execute(f"SELECT * FROM read_blob('{store / DB_NAME}')")
    finally:
        reader.close()


def test_a_second_connection_in_one_process_keeps_the_sandbox(store):
    # DuckDB shares one database between the connections of a process: the second finds the
    # configuration already locked, and the sandbox in place.
    first, second = open_sql(store), open_sql(store)
    for con in (first, second):
        with pytest.raises(duckdb.Error, match="disabled"):
            con.execute(f"SELECT * FROM read_blob('{store / DB_NAME}')")
        assert con.execute("SELECT count(*) FROM runs").fetchall() == [(3,)]


def test_the_viewers_scan_runs_under_a_small_limit_then_is_locked_down(store):
    """The run index is built under a small memory limit (the pass leaves little of the file
    cached), set before the configuration is locked; after it, the limit is back and locked."""
    import os

    from replay.bounded import memory_limit
    from replay.web.db import SCAN_MEMORY, SharedReader

    reader = SharedReader(store)
    try:
        with reader.cursor() as cur:
            default = memory_limit(cur)

        def step(cur):  # (on the idle connection, opened again for it)
            assert memory_limit(cur) == SCAN_MEMORY * (os.cpu_count() or 1)
            with pytest.raises(duckdb.Error, match="disabled"):
                cur.execute(f"SELECT * FROM read_blob('{store / DB_NAME}')")
            return cur.execute("SELECT count(*) FROM runs").fetchall()

        assert reader.scan(step) == [(3,)]
        with reader.cursor() as cur:
            # (the sandbox cannot reset the limit: what it was is set back, as DuckDB rounded it)
            assert abs(memory_limit(cur) - default) < default / 100
            with pytest.raises(duckdb.Error, match="lock"):
                cur.execute("SET memory_limit = '1GiB'")
    finally:
        reader.close()


def test_the_viewers_scan_runs_again_with_more_memory_while_the_database_runs_short(
    store, monkeypatch, memory_growth
):
    """A limit too small for the run index: the build runs again with twice the limit until it fits
    (a read has nothing to undo), and the viewer gets the whole index."""
    from replay.web import db, runs

    monkeypatch.setattr(db, "SCAN_MEMORY", 1 << 12)
    reader = db.SharedReader(store)
    try:
        index = reader.scan(lambda cur: runs.build_run_index(cur, reader.generation()))
    finally:
        reader.close()
    assert memory_growth, "the first limit was enough: the retry was not reached"
    assert len(index.rows) == 3
