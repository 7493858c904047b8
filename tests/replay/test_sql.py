"""amb sql: read-only, no files, no network, no way to unlock."""

from __future__ import annotations

import duckdb
import pytest

from replay.store import open_sql


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
