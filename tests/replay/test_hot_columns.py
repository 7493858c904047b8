"""Typed hot columns (replay.hot): the views read them and give exactly what the JSON definitions
gave; the migration backfills an older store; verify catches a column edited apart from its payload."""

from __future__ import annotations

import json

import pytest

from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay import hot, views
from replay.ingest import ingest
from replay.store import Store
from replay.verify import verify
from schemas.events import ModelCallCompleted, NetworkRequest, RunFinished, RunStarted


def _hostile_run(root) -> None:
    """A run whose payloads hold values of the wrong type where the hot columns look: ingest does not
    validate payload types, so the columns must not make such a spool unloadable."""
    rec = SpoolWriter(spool_path(root, "odd", "recorder"), "odd", "recorder", sync=False)
    rec.append(RunStarted(model=None, task="t"))
    proxy = SpoolWriter(spool_path(root, "odd", "proxy"), "odd", "proxy", sync=False)
    proxy.append(ModelCallCompleted(call_id="c0", provider="openai", api="responses", ok=False, error="x"))
    proxy.append(NetworkRequest(method="GET", host="h", path="/a?b=1", status=None, error="blocked"))
    proxy.close()
    rec.append(RunFinished(status="failed", exit_code=None))
    rec.close()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("hot") / "store"
    for i in range(4):
        generate_run(root, f"run-{i}", seed=i, calls=8)
    _hostile_run(root)
    ingest(root, spool_mode="keep")
    return root


def _rows(con, sql: str) -> list:
    return sorted(con.execute(sql).fetchall(), key=repr)


def test_views_match_the_json_definitions(mixed):
    with Store.open(mixed) as st:
        for statement in views.ddl(typed=False, prefix="json_"):
            st.con.execute(statement)
        for view in views.VIEWS:
            typed = _rows(st.con, f"SELECT * FROM {view.name}")
            from_json = _rows(st.con, f"SELECT * FROM json_{view.name}")
            assert typed, view.name
            assert typed == from_json, view.name
        # and the typed views really read the columns, not the payload
        ddl = "\n".join(views.ddl())
        assert "usage.input_total" not in ddl and "r.tool_call_id" in ddl


def test_columns_hold_the_payload_fields(mixed):
    with Store.open(mixed, read_only=True) as st:
        row = st.con.execute(
            "SELECT CAST(payload AS VARCHAR), model, input_tokens, output_tokens, latency_ms, status "
            "FROM events WHERE kind = 'model_call.completed' AND run_id = 'run-1' ORDER BY seq LIMIT 1"
        ).fetchall()[0]
        p = json.loads(row[0])
        assert row[1:] == (
            p["model"],
            p["usage"]["input_total"],
            p["usage"]["output"],
            p["latency_ms"],
            p["status"],
        )
        # run.finished's status is text: not an HTTP status, so NULL; its exit code is there
        assert st.con.execute(
            "SELECT status, exit_code FROM events WHERE kind = 'run.finished' AND run_id = 'run-0'"
        ).fetchall() == [(None, 0)]


def test_migration_backfills_an_older_store(tmp_path, mixed):
    """A store made before the hot columns (the events table of core.m001) gets them filled."""
    root = tmp_path / "old"
    for i in range(2):
        generate_run(root, f"run-{i}", seed=i, calls=8)
    ingest(root, spool_mode="keep")
    with Store.open(root) as st:
        expected = _rows(st.con, "SELECT * FROM model_calls")
        for c in hot.HOT_COLUMNS:
            st.con.execute(f"ALTER TABLE events DROP COLUMN {c.name}")
        st.con.execute("DELETE FROM _amb_migrations WHERE name = 'core.m005_hot_columns'")
        views.create_views(st.con)  # the JSON views, as such a store had
        assert not hot.present(st.con)
    with Store.open(root) as st:
        assert hot.present(st.con)
        assert _rows(st.con, "SELECT * FROM model_calls") == expected
        assert (
            st.con.execute("SELECT count(*) FROM events WHERE input_tokens IS NOT NULL").fetchall()[0][0] > 0
        )
        assert verify(st.con, st.blobs) == []


def test_a_migration_recorded_under_its_former_name_is_not_run_again(tmp_path):
    """Stores that applied the hot columns and the zstd payload under the migrations' former names
    keep them as they are: opening such a store applies nothing."""
    from replay import migrations

    root = tmp_path / "store"
    generate_run(root, "run-0", seed=0, calls=4)
    ingest(root)
    renamed = [m for m in migrations.CORE if m.formerly]
    assert renamed, "no migration has a former name"
    with Store.open(root) as st:
        for m in renamed:
            st.con.execute("UPDATE _amb_migrations SET name = ? WHERE name = ?", [m.formerly[0], m.name])
        assert migrations.pending(st.con, migrations.CORE) == []
        assert migrations.apply(st.con, migrations.CORE) == []


def test_verify_catches_a_hot_column_edited_alone(tmp_path):
    root = tmp_path / "store"
    generate_run(root, "run-0", seed=0, calls=6)
    ingest(root)
    with Store.open(root) as st:
        st.con.execute(
            "UPDATE events SET output_tokens = output_tokens + 1000 "
            "WHERE run_id = 'run-0' AND source = 'proxy' "
            "AND seq = (SELECT min(seq) FROM events WHERE kind = 'model_call.completed')"
        )
        found = verify(st.con, st.blobs)
    assert len(found) == 1 and found[0].kind == "model_call.completed"
    assert "hot column output_tokens differs from the payload" in found[0].what


def test_views_match_on_recorded_and_hostile_runs(viewer_store, tmp_path):
    """The same comparison on the viewer tests' store: runs recorded through amb-record, a
    100k-event run, and a hostile run (markup in text, tool arguments and file names)."""
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(viewer_store.root, copy, ignore=shutil.ignore_patterns("blobs", "spool"))
    with Store.open(copy) as st:
        for statement in views.ddl(typed=False, prefix="json_"):
            st.con.execute(statement)
        for view in views.VIEWS:
            for check in (
                f"SELECT * FROM {view.name} EXCEPT ALL SELECT * FROM json_{view.name}",
                f"SELECT * FROM json_{view.name} EXCEPT ALL SELECT * FROM {view.name}",
            ):
                assert st.con.execute(f"SELECT count(*) FROM ({check})").fetchall() == [(0,)], check
            n = st.con.execute(f"SELECT count(*) FROM {view.name}").fetchall()[0][0]
            assert n == st.con.execute(f"SELECT count(*) FROM json_{view.name}").fetchall()[0][0] > 0
