"""`amb --version`: the package version, the event versions read and written, the store's level."""

from __future__ import annotations

from importlib import metadata

from click.testing import CliRunner

from amb.about import event_versions, store_migrations
from amb.main import cli
from replay.migrations import applied
from replay.store import Store
from schemas.events import KINDS
from scorer.migrations import MIGRATIONS


def test_version_names_the_package_the_events_and_the_store():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    first, events, store = result.stdout.splitlines()
    assert first.startswith(f"amb {metadata.version('amb-recorder')} (amb-recorder, Python 3.")
    # note and the kinds that hold OS strings are at v2, each with an upcaster from v1 (golden v1 logs
    # are read); the others are v1.
    os_kinds = "file.accessed, file.deleted, file.renamed, file.written"
    at_v1 = "model_call.completed, network.request, run.finished, tool_call.requested, tool_call.result"
    upcast = ", ".join(
        f"{k} v1-v2"
        for k in (*os_kinds.split(", "), "note", "process.exited", "run.started", "submission.sealed")
    )
    assert events == (
        f"events: writes v2 ({len(KINDS) - 5} kinds); {at_v1} v1; reads those and, upcast on read, {upcast}"
    )
    # The level is the last migration of each group, from the lists themselves (a new migration
    # moves it); that a new store reaches exactly this level is the next test.
    names = store_migrations()
    last = {n.split(".")[0]: n for n in names}
    assert store == f"store: migration level {last['core']}, {last['scorer']} ({len(names)} migrations)"


def test_the_level_is_what_a_new_store_has(tmp_path):
    st = Store.open(tmp_path / "store", extra_migrations=MIGRATIONS)
    try:
        assert applied(st.con) == set(store_migrations())
    finally:
        st.close()
    assert event_versions()["note"] == (1, 2) and event_versions()["run.finished"] == (1, 1)
