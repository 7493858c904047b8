"""Typed hot columns (replay.hot): the views read them and give exactly what the JSON definitions
gave; the migration backfills an older store; verify catches a column edited apart from its payload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay import hot, views
from replay.ingest import ingest
from replay.store import Store
from replay.summary import summary
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


def _failed_call_run(root) -> None:
    """A run of two model calls, the second failed."""
    rec = SpoolWriter(spool_path(root, "run-f", "recorder"), "run-f", "recorder", sync=False)
    rec.append(RunStarted(model="m", task="t"))
    proxy = SpoolWriter(spool_path(root, "run-f", "proxy"), "run-f", "proxy", sync=False)
    proxy.append(ModelCallCompleted(call_id="c0", provider="openai", api="responses", model="m"))
    proxy.append(
        ModelCallCompleted(call_id="c1", provider="openai", api="responses", ok=False, error="http_500")
    )
    proxy.close()
    rec.append(RunFinished(status="failed", exit_code=1))
    rec.close()


def test_ok_is_a_hot_column_that_the_failed_call_count_reads(tmp_path):
    """The call's ``ok`` is stored as a column at ingest; the model_calls view (and so the runs'
    failed-call count) reads that column, not the payload."""
    root = tmp_path / "store"
    _failed_call_run(root)
    ingest(root)
    with Store.open(root) as st:
        oks = "SELECT ok FROM events WHERE kind = 'model_call.completed' ORDER BY seq"
        assert st.con.execute(oks).fetchall() == [(True,), (False,)]
        assert summary(st.con, "run-f").failed_calls == 1
        st.con.execute("UPDATE events SET ok = true WHERE kind = 'model_call.completed'")
        assert summary(st.con, "run-f").failed_calls == 0  # the column, not the payload, was read
    assert "ok AS ok" in next(d for d in views.ddl() if "VIEW model_calls" in d)


def _amb_verify(root) -> subprocess.CompletedProcess[str]:
    amb = Path(sys.executable).with_name("amb")
    return subprocess.run([amb, "verify", "--store", str(root)], capture_output=True, text=True, timeout=120)


def test_verify_catches_an_ok_that_disagrees_with_the_payload(tmp_path):
    """``ok`` edited alone (a failed call made to look fine), then the payload edited instead (the
    column still says failed): ``amb verify`` fails on each, naming the event."""
    root = tmp_path / "store"
    _failed_call_run(root)
    ingest(root)
    failed = "run_id = 'run-f' AND kind = 'model_call.completed' AND NOT ok"
    with Store.open(root) as st:
        st.con.execute(f"UPDATE events SET ok = true WHERE {failed}")
    got = _amb_verify(root)
    assert got.returncode == 1
    assert "run run-f source proxy seq 1" in got.stdout
    assert "hot column ok differs from the payload" in got.stdout
    with Store.open(root) as st:
        st.con.execute("UPDATE events SET ok = false WHERE run_id = 'run-f' AND seq = 1 AND source = 'proxy'")
        st.con.execute(
            "UPDATE events SET payload = replace(payload, '\"ok\":false', '\"ok\":true') "
            "WHERE run_id = 'run-f' AND seq = 1 AND source = 'proxy'"
        )
        assert st.con.execute(
            "SELECT count(*) FROM events WHERE payload::VARCHAR LIKE '%\"ok\":false%'"
        ).fetchall() == [(0,)]
    got = _amb_verify(root)
    assert got.returncode == 1 and "run run-f source proxy seq 1" in got.stdout


def test_migration_adds_ok_to_a_store_past_the_first_hot_columns(tmp_path):
    """A store that already had the first hot columns (but not ``ok``) gets ``ok`` added and filled
    by its own migration, and the views read it."""
    root = tmp_path / "store"
    _failed_call_run(root)
    generate_run(root, "run-0", seed=0, calls=6)
    ingest(root, spool_mode="keep")
    with Store.open(root) as st:
        expected = _rows(st.con, "SELECT * FROM model_calls")
        st.con.execute("ALTER TABLE events DROP COLUMN ok")
        st.con.execute("DELETE FROM _amb_migrations WHERE name = 'core.m007_hot_column_ok'")
        views.create_views(st.con)  # the views such a store had (no ok column to read)
        assert [c.name for c in hot.stored(st.con)] == [c.name for c in hot.HOT_COLUMNS if c.name != "ok"]
        assert verify(st.con, st.blobs) == []
        # the hot columns it has are still checked (a read-only `amb verify` before any writer)
        one_call = "run_id = 'run-f' AND source = 'proxy' AND seq = 0"
        st.con.execute(f"UPDATE events SET output_tokens = output_tokens + 1 WHERE {one_call}")
        (found,) = verify(st.con, st.blobs)
        assert "hot column output_tokens differs from the payload" in found.what
        st.con.execute(f"UPDATE events SET output_tokens = output_tokens - 1 WHERE {one_call}")
    with Store.open(root) as st:
        assert hot.present(st.con)
        assert _rows(st.con, "SELECT * FROM model_calls") == expected
        assert summary(st.con, "run-f").failed_calls == 1
        assert verify(st.con, st.blobs) == []
