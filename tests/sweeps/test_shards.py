"""Shards coming home: exactly one result per cell, duplicates kept aside, idempotent bulk loading,
store merging, and hostile shard directories refused with a clear error (the real store, the real
``amb ingest --from`` command)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from amb.main import cli
from replay.shard_check import ShardError, check_shard
from replay.shards import load_shards
from replay.spools import compressed_path
from replay.spools import read_bytes as read_spool
from replay.store import Store
from sweeps.collect import select
from sweeps.shard import SHARD_FILE, Layout, claimed
from sweeps.spec import Cell, parse_run_id, run_id
from tests.recorder.importers.store_state import files
from tests.sweeps.shard_helpers import make_shard

BIN = Path(sys.executable).parent
CELL = Cell("s", "agent", "bccd-det", "lite", 1)


def amb(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command, in this process (a new interpreter per call would cost seconds each)."""
    result = CliRunner().invoke(cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_a_refused_shard_is_one_clear_error_from_the_installed_command(tmp_path):
    layout, shard, rid = _hostile(tmp_path, "sym")
    spool = shard / "spool" / rid / "proxy.spool"
    spool.unlink()
    spool.symlink_to("/etc/passwd")
    proc = subprocess.run(
        [str(BIN / "amb"), "ingest", "--store", str(tmp_path / "st"), "--from", str(layout.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"amb: error: {shard}: refused: spool/{rid}/proxy.spool is a symbolic link" in proc.stderr


def runs_in(store: Path) -> dict[str, int]:
    with Store.open(store, read_only=True) as st:
        return dict(st.con.execute("SELECT run_id, count(*) FROM events GROUP BY run_id").fetchall())


def test_run_id_is_a_pure_function_of_cell_and_attempt():
    assert run_id(CELL, 1) == "s-agent-bccd-det-lite-r1"
    assert run_id(CELL, 3) == "s-agent-bccd-det-lite-r1.a3"
    assert run_id(Cell("s", "agent", "bccd-det", "lite", 1), 3) == run_id(CELL, 3)
    assert parse_run_id(run_id(CELL, 3)) == (CELL.key, 3)
    assert parse_run_id(run_id(CELL, 1)) == (CELL.key, 1)
    with pytest.raises(ValueError):
        run_id(CELL, 0)


def test_one_result_per_cell_duplicates_kept_aside_and_loading_is_idempotent(tmp_path):
    layout = Layout(tmp_path / "sweep")
    layout.make()
    # attempt 1 failed, attempt 2 completed first, attempt 3 completed later (an engine that ran the
    # cell again), and attempt 2 was executed twice (at least once): the second copy is a duplicate.
    make_shard(layout, CELL, 1, status="failed", seed=1)
    path2, first2 = make_shard(layout, CELL, 2, seed=2)
    dup_path, dup_first = make_shard(layout, CELL, 2, seed=5)
    make_shard(layout, CELL, 3, seed=3)
    other = Cell("s", "agent", "bccd-det", "standard", 1)
    make_shard(layout, other, 1, seed=4)
    assert first2 and not dup_first and dup_path.parent.parent == layout.duplicates
    assert claimed(layout, CELL.key) == run_id(CELL, 2)

    sel = select(layout)
    assert [rid for _, rid in sel.take] == sorted([run_id(CELL, 1), run_id(CELL, 2), run_id(other, 1)])
    assert sorted(p.name for p in sel.duplicates) == sorted([run_id(CELL, 3), dup_path.name])

    store = tmp_path / "store"
    proc = amb("ingest", "--store", str(store), "--from", str(layout.root), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["sources"][0]
    assert sorted(report["loaded"]) == sorted(rid for _, rid in sel.take) and not report["refused"]
    assert len(report["duplicates"]) == 2
    first = runs_in(store)
    assert set(first) == {rid for _, rid in sel.take}
    # the stored run of the cell is attempt 2's placed execution, byte for byte, not the duplicate's
    rid2 = run_id(CELL, 2)
    for name in ("recorder.spool", "proxy.spool", "shim.spool"):
        # Ingest compresses a finished run's spools (replay.spools); the bytes inside are the same.
        kept = store / "spool" / rid2 / name
        stored = read_spool(kept if kept.exists() else compressed_path(kept))
        assert stored == (path2 / "spool" / rid2 / name).read_bytes()
        assert stored != (dup_path / "spool" / rid2 / name).read_bytes()

    again = amb("ingest", "--store", str(store), "--from", str(layout.root), "--json")
    assert again.returncode == 0, again.stderr
    rep = json.loads(again.stdout)["sources"][0]
    assert rep["events_added"] == 0 and rep["spools_copied"] == 0 and rep["blobs_copied"] == 0
    assert runs_in(store) == first
    verify = amb("verify", "--store", str(store))
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_stores_merge(tmp_path):
    a, b = Layout(tmp_path / "a"), Layout(tmp_path / "b")
    for layout, cell, seed in ((a, CELL, 7), (b, Cell("s", "agent", "bccd-det", "standard", 1), 8)):
        layout.make()
        make_shard(layout, cell, seed=seed)
    for layout, store in ((a, "store-a"), (b, "store-b")):
        assert amb("ingest", "--store", str(tmp_path / store), "--from", str(layout.root)).returncode == 0
    merged = tmp_path / "merged"
    proc = amb(
        "ingest",
        "--store",
        str(merged),
        "--from",
        str(tmp_path / "store-a"),
        "--from",
        str(tmp_path / "store-b"),
    )
    assert proc.returncode == 0, proc.stderr
    assert runs_in(merged) == {**runs_in(tmp_path / "store-a"), **runs_in(tmp_path / "store-b")}
    assert amb("verify", "--store", str(merged)).returncode == 0
    again = amb("ingest", "--store", str(merged), "--from", str(tmp_path / "store-a"), "--json")
    assert json.loads(again.stdout)["sources"][0]["events_added"] == 0
    # Ingest compressed store-a's spools (the default): the merge read them through the .zst. A store
    # that dropped them cannot be merged from: one clear refusal, nothing half-loaded.
    assert any(p.name.endswith(".spool.zst") for p in (tmp_path / "store-a" / "spool").rglob("*"))
    c = Layout(tmp_path / "c")
    c.make()
    make_shard(c, Cell("s", "agent", "kidney-seg", "lite", 1), seed=9)
    assert (
        amb(
            "ingest", "--store", str(tmp_path / "store-c"), "--spools", "drop", "--from", str(c.root)
        ).returncode
        == 0
    )
    refused = amb("ingest", "--store", str(tmp_path / "merged-c"), "--from", str(tmp_path / "store-c"))
    assert refused.returncode != 0 and "dropped the spool after ingest" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("mode", ["compress", "drop"])
def test_a_store_never_takes_in_another_run_under_an_id_it_holds(tmp_path, mode):
    """`amb ingest --from OTHERSTORE` merged a run of the same id into the store's run (its events
    appended, its manifest broken); a sweep shard did the same when the store had dropped its
    spools. Whatever form the store keeps the run in, another run under its id is refused (exit 2,
    one reason naming the id and the way out) and the store stays byte for byte as it was; the
    very same run loads again as a no-op."""
    from recorder.importers.atif import parse
    from recorder.importers.common import write
    from recorder.synthetic import generate_run

    home, twin, other, imported = (tmp_path / n for n in ("home", "twin", "other", "imported"))
    generate_run(home, "r-1", seed=1, calls=2)
    shutil.copytree(home, twin)  # the very same run, in another store
    generate_run(other, "r-1", seed=2, calls=2)  # another run under the same id and sources
    assert amb("ingest", "--store", str(home), "--spools", mode).returncode == 0
    for store in (twin, other):
        assert amb("ingest", "--store", str(store), "--spools", "keep").returncode == 0
    # The same run exported and imported elsewhere: the same id, another source.
    assert amb("export", "atif", "--store", str(home), "r-1", "--out", str(tmp_path / "x")).returncode == 0
    write(imported, parse(tmp_path / "x" / "r-1")[0])
    assert amb("ingest", "--store", str(imported)).returncode == 0
    before = files(home)
    for source, why in ((other, "another proxy spool"), (imported, "spools of import")):
        r = amb("ingest", "--store", str(home), "--from", str(source))
        assert r.returncode == 2, r.stderr
        line = next(x for x in r.stderr.splitlines() if "refused" in x)
        assert "run id 'r-1' already exists" in line and why in line and "--store" in line, line
        assert files(home) == before
    same = amb("ingest", "--store", str(home), "--from", str(twin), "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["sources"][0]["events_added"] == 0 and files(home) == before
    assert amb("verify", "--store", str(home)).returncode == 0


@pytest.mark.parametrize("mode", ["compress", "drop"])
def test_a_sweep_run_again_under_its_name_does_not_merge_into_the_first(tmp_path, mode):
    first, second = Layout(tmp_path / "first"), Layout(tmp_path / "second")
    for layout, seed in ((first, 1), (second, 2)):
        layout.make()
        make_shard(layout, CELL, seed=seed)
    store = tmp_path / "store"
    assert amb("ingest", "--store", str(store), "--spools", mode, "--from", str(first.root)).returncode == 0
    before = files(store)
    r = amb("ingest", "--store", str(store), "--from", str(second.root))
    assert r.returncode == 2 and f"run id '{run_id(CELL, 1)}' already exists" in r.stderr, r.stderr
    assert files(store) == before
    again = amb("ingest", "--store", str(store), "--from", str(first.root), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["sources"][0]["events_added"] == 0
    report = load_shards(store, [(second.shard(run_id(CELL, 1)), run_id(CELL, 1))])
    assert report.taken and not report.loaded and files(store) == before


def _edit_info(shard: Path, **changes: object) -> None:
    info = json.loads((shard / SHARD_FILE).read_text())
    info.update(changes)
    (shard / SHARD_FILE).write_text(json.dumps(info))


def _hostile(tmp_path: Path, name: str) -> tuple[Layout, Path, str]:
    layout = Layout(tmp_path / name)
    layout.make()
    shard, _ = make_shard(layout, CELL, 1)
    return layout, shard, run_id(CELL, 1)


def test_hostile_shards_are_refused_with_a_clear_error(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the store")
    cases: dict[str, tuple[str, str]] = {}

    layout, shard, rid = _hostile(tmp_path, "symlink")
    spool = shard / "spool" / rid / "shim.spool"
    spool.unlink()
    spool.symlink_to(secret)
    cases["symlink"] = (str(shard), "symbolic link")

    layout, shard, rid = _hostile(tmp_path, "symlinked-shard")
    real = tmp_path / "elsewhere"
    shutil.move(str(shard), real)
    shard.symlink_to(real)
    cases["symlinked-shard"] = (str(shard), "symbolic link")

    layout, shard, rid = _hostile(tmp_path, "traversal")
    files = json.loads((shard / SHARD_FILE).read_text())["files"]
    files["../../secret.txt"] = secret.stat().st_size
    _edit_info(shard, files=files)
    cases["traversal"] = (str(shard), "not a shard's file")

    layout, shard, rid = _hostile(tmp_path, "other-run-in-json")
    _edit_info(shard, run_id="s-agent-bccd-det-lite-r9")
    cases["other-run-in-json"] = (str(shard), "claims run")

    layout, shard, rid = _hostile(tmp_path, "other-run-spool-dir")
    os.rename(shard / "spool" / rid, shard / "spool" / "victim-run")
    cases["other-run-spool-dir"] = (str(shard), "spools of run 'victim-run'")

    layout, shard, rid = _hostile(tmp_path, "other-run-events")
    # A spool whose events belong to another run, sized correctly in shard.json.
    victim = tmp_path / "victim"
    from recorder.synthetic import generate_run

    generate_run(victim, "victim-run", calls=1)
    src = victim / "spool" / "victim-run" / "proxy.spool"
    shutil.copyfile(src, shard / "spool" / rid / "proxy.spool")
    files = json.loads((shard / SHARD_FILE).read_text())["files"]
    files[f"spool/{rid}/proxy.spool"] = src.stat().st_size
    _edit_info(shard, files=files)
    cases["other-run-events"] = (str(shard), "an event of run 'victim-run'")

    layout, shard, rid = _hostile(tmp_path, "truncated")
    spool = shard / "spool" / rid / "proxy.spool"
    data = spool.read_bytes()
    spool.write_bytes(data[: len(data) - 40])
    cases["truncated"] = (str(shard), "truncated")

    layout, shard, rid = _hostile(tmp_path, "torn-and-resized")
    spool = shard / "spool" / rid / "proxy.spool"
    data = spool.read_bytes()[:-40]
    spool.write_bytes(data)
    files = json.loads((shard / SHARD_FILE).read_text())["files"]
    files[f"spool/{rid}/proxy.spool"] = len(data)
    _edit_info(shard, files=files)
    cases["torn-and-resized"] = (str(shard), "truncated")

    layout, shard, rid = _hostile(tmp_path, "bad-blob")
    pack = next((shard / "blobs" / "packs").glob("*.pack"))  # the recorder's blobs are packed
    raw = bytearray(pack.read_bytes())
    raw[len(raw) // 2 :] = b"x" * (len(raw) - len(raw) // 2)  # same size: only the content lies
    pack.chmod(0o644)
    pack.write_bytes(bytes(raw))
    cases["bad-blob"] = (str(shard), "corrupted")

    layout, shard, rid = _hostile(tmp_path, "lying-index")
    index = next((shard / "blobs" / "packs").glob("*.idx"))
    index.chmod(0o644)
    with open(index, "r+b") as f:  # the last entry's offset and length: far outside its pack
        f.seek(-13, os.SEEK_END)
        f.write((2**40).to_bytes(8, "big") + (2**31).to_bytes(4, "big"))
    cases["lying-index"] = (str(shard), "outside the pack")

    layout, shard, rid = _hostile(tmp_path, "fifo")
    os.mkfifo(shard / "spool" / rid / "extra.spool")
    cases["fifo"] = (str(shard), "not a regular file")

    store = tmp_path / "store"  # one store for every case: each is refused, so it stays empty
    for name, (path, message) in cases.items():
        proc = amb("ingest", "--store", str(store), "--from", str(tmp_path / name))
        assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert message in proc.stderr and "refused" in proc.stderr, (name, proc.stderr)
        assert path in proc.stderr, (name, proc.stderr)  # the error names the shard
        # nothing of a refused shard reaches the store
        assert not (store / "spool").exists() or not any((store / "spool").iterdir()), name
    # a refused shard next to good ones: the good ones load
    layout, shard, rid = _hostile(tmp_path, "mixed")
    make_shard(layout, Cell("s", "agent", "bccd-det", "standard", 1), seed=9)
    _edit_info(shard, run_id="s-agent-bccd-det-lite-r2")
    proc = amb("ingest", "--store", str(tmp_path / "store-mixed"), "--from", str(layout.root))
    assert proc.returncode == 1 and "claims run" in proc.stderr
    assert set(runs_in(tmp_path / "store-mixed")) == {"s-agent-bccd-det-standard-r1"}


def test_check_shard_names_the_shard(tmp_path):
    layout, shard, rid = _hostile(tmp_path, "x")
    with pytest.raises(ShardError, match=str(shard)):
        check_shard(shard, "s-agent-bccd-det-lite-r7")
    report = load_shards(tmp_path / "st", [(shard, rid)])
    assert report.loaded == [rid] and not report.refused
    assert msgspec.json.decode((shard / SHARD_FILE).read_bytes())["run_id"] == rid


@pytest.mark.parametrize(("first", "state"), [("failed", "pending"), ("budget_exceeded", "gave_up")])
def test_a_run_over_budget_is_not_retried(tmp_path, first, state):
    """A failed attempt is retried; one that spent its budget ends the cell (a retry would spend it
    again), and is loaded as the cell's run like any ended attempt."""
    from sweeps.spec import Agent
    from sweeps.state import CellState, TaskRef, read_cell

    layout = Layout(tmp_path / "root")
    layout.make()
    make_shard(layout, CELL, 1, status=first)
    cell = CellState(CELL.sweep, Agent(name=CELL.agent, command=["true"]), TaskRef(CELL.task), CELL.tier, 1)
    read_cell(layout, cell, max_attempts=3)
    assert cell.attempts == [(run_id(CELL, 1), first)] and cell.state == state
    assert cell.final_run == run_id(CELL, 1)
