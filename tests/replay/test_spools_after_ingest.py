"""Spools after ingest (replay.spools): compressed or dropped once their run is ingested; verify,
re-ingest, rebuilding the database and the manifests keep working, and every tamper is still caught."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import zstandard

from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay import manifest as manifests
from replay.ingest import ingest
from replay.store import Store
from replay.verify import verify
from schemas.errors import SpoolError
from schemas.events import Note, RunStarted
from schemas.run_claim import held_spools


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Two synthetic runs' spools and blobs, not ingested: each test ingests a copy."""
    root = tmp_path_factory.mktemp("spools") / "store"
    for i in range(2):
        generate_run(root, f"run-{i}", seed=i, calls=6)
    return root


@pytest.fixture
def make(tmp_path, generated):
    def _store(mode: str, runs: int = 2):
        root = tmp_path / "store"
        shutil.copytree(generated / "blobs", root / "blobs")
        for i in range(runs):
            shutil.copytree(generated / "spool" / f"run-{i}", root / "spool" / f"run-{i}")
        return root, ingest(root, spool_mode=mode)

    return _store


def _snapshot(root) -> list:
    with Store.open(root, read_only=True) as st:
        return st.con.execute("SELECT run_id, source, seq, hash FROM events ORDER BY ALL").fetchall()


def _anchor(root, run_id: str) -> dict[str, Any]:
    with Store.open(root, read_only=True) as st:
        found = manifests.stored(st.con, run_id)
    assert found is not None
    return found


def _files(root) -> list[str]:
    return sorted(
        p.relative_to(root / "spool").as_posix() for p in (root / "spool").rglob("*") if p.is_file()
    )


@pytest.mark.parametrize("mode", ["compress", "drop"])
def test_spools_settle_and_the_store_still_verifies(make, mode):
    root, report = make(mode)
    files = _files(root)
    suffix = ".spool.zst" if mode == "compress" else ".spool.dropped"
    assert report.settled == {
        "compressed": 4 if mode == "compress" else 0,
        "dropped": 4 if mode == "drop" else 0,
    }
    for run in ("run-0", "run-1"):
        # the recorder's spool (the run's claim and outcome) stays as written; the others settle
        assert f"{run}/recorder.spool" in files
        assert {f"{run}/proxy{suffix}", f"{run}/shim{suffix}"} <= set(files)
        assert f"{run}/proxy.spool" not in files
    if mode == "drop":
        assert all((root / "spool" / f).stat().st_size == 0 for f in files if f.endswith(".dropped"))
    before = _snapshot(root)
    anchored = _anchor(root, "run-0")
    with Store.open(root, read_only=True) as st:
        assert verify(st.con, st.blobs) == []
    again = ingest(root, spool_mode=mode)
    assert (again.events_added, again.files_loaded) == (0, 0)
    assert _snapshot(root) == before
    with Store.open(root, read_only=True) as st:
        assert verify(st.con, st.blobs, anchored=[anchored]) == []


def test_database_rebuilt_from_compressed_spools(make):
    root, _ = make("compress")
    before = _snapshot(root)
    anchored = [_anchor(root, r) for r in ("run-0", "run-1")]
    for name in ("amb.duckdb", "amb.duckdb.wal"):
        (root / name).unlink(missing_ok=True)
    rebuilt = ingest(root)
    assert rebuilt.events_added == len(before)
    assert _snapshot(root) == before
    with Store.open(root, read_only=True) as st:
        assert verify(st.con, st.blobs, anchored=anchored) == []


@pytest.mark.parametrize("mode", ["compress", "drop"])
def test_every_tamper_is_still_caught(make, mode):
    """The checks of amb verify read the database, not the spools: each tamper kind of
    tests/replay/test_verify.py is caught whatever became of the spools."""
    root, _ = make(mode)
    anchored = _anchor(root, "run-1")
    edits = {
        "hash mismatch": "UPDATE events SET payload = replace(CAST(payload AS VARCHAR), 'execute_code', 'x') "
        "WHERE run_id = 'run-0' AND source = 'proxy' AND seq = 1",
        "sequence gap": "DELETE FROM events WHERE run_id = 'run-0' AND source = 'shim' AND seq = 2",
        "manifest": "DELETE FROM events WHERE run_id = 'run-0' AND source = 'proxy' AND seq = "
        "(SELECT max(seq) FROM events WHERE run_id = 'run-0' AND source = 'proxy')",
    }
    for expected, edit in edits.items():
        with Store.open(root) as st:
            st.con.execute("BEGIN TRANSACTION")
            st.con.execute(edit)
            found = verify(st.con, st.blobs)
            st.con.execute("ROLLBACK")
        assert found and expected in found[0].what, (expected, found[:2])
    # A chain rebuilt by someone who can write the file: only the anchored manifest catches it.
    with Store.open(root) as st:
        st.con.execute("DELETE FROM events WHERE run_id = 'run-1' AND source = 'shim'")
        st.con.execute("DELETE FROM manifests WHERE run_id = 'run-1'")
        found = verify(st.con, st.blobs, anchored=[anchored])
    assert [p for p in found if "anchored manifest" in p.what and "shim" in p.what]


def test_unfinished_or_changed_spools_are_left_alone(tmp_path):
    root = tmp_path / "store"
    rec = SpoolWriter(spool_path(root, "live", "recorder"), "live", "recorder", sync=False)
    rec.append(RunStarted(task="t"))
    proxy = SpoolWriter(spool_path(root, "live", "proxy"), "live", "proxy", sync=False)
    proxy.append(Note(text="hi"))
    ingest(root)  # no run.finished yet: nothing settles
    assert (root / "spool/live/proxy.spool").exists()
    proxy.append(Note(text="more"))
    proxy.close()
    rec.close()
    assert ingest(root).events_added == 1
    assert (root / "spool/live/proxy.spool").exists()


def test_a_plain_spool_beside_its_compressed_copy_wins(make):
    """A crash between writing the .zst and removing the plain file leaves both; ingest reads the plain."""
    root, _ = make("compress", runs=1)
    zst = root / "spool/run-0/proxy.spool.zst"
    (root / "spool/run-0/proxy.spool").write_bytes(zstandard.ZstdDecompressor().decompress(zst.read_bytes()))
    zst.write_bytes(b"not zstd")
    (root / "amb.duckdb").unlink()
    assert ingest(root, spool_mode="keep").events_added == len(_snapshot(root)) > 0


def test_a_corrupt_compressed_spool_is_named(make):
    root, _ = make("compress", runs=1)
    (root / "spool/run-0/shim.spool.zst").write_bytes(b"\x28\xb5\x2f\xfd garbage")
    (root / "amb.duckdb").unlink()
    with pytest.raises(SpoolError, match=r"spool/run-0/shim.spool.zst: cannot decompress") as e:
        ingest(root)
    report = e.value.report  # type: ignore[attr-defined]  # ingest attaches its report to the error
    assert [k for k, _ in report.failed] == ["spool/run-0/shim.spool"] and report.files_loaded == 2


def test_a_dropped_spool_still_claims_its_run_id(make):
    root, _ = make("drop", runs=1)
    held = held_spools(root, "run-0")
    assert held and all(p.name.endswith((".spool.dropped", "recorder.spool")) for p in held.values())
    for p in list(held.values()):
        p.unlink()
    assert held_spools(root, "run-0") == {}
    (root / "spool/run-0/import.spool.dropped").touch()
    assert set(held_spools(root, "run-0")) == {"import"}
