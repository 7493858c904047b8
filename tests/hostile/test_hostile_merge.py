"""`amb ingest --from` of another store or a sweep's shard that was damaged or crafted: run folders
that are files, links or empty, and runs whose events refer to blobs that came with nothing.

Each is refused with one line naming it (exit 1), nothing of it is copied, every other run loads,
and the store still passes `amb verify`. Runs are made by the real spool writer
(``recorder.synthetic``) and loaded by the real command.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import msgspec
import pytest

from recorder.proxy.blobwriter import BlobWriter
from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay.store import Store
from schemas.blob import BlobRef
from schemas.blobpack import pack_path
from schemas.events import FileWritten, RunStarted
from sweeps.shard import SHARD_FILE, Layout
from sweeps.spec import Cell
from tests.recorder.importers.store_state import amb, event_hashes, files
from tests.sweeps.shard_helpers import make_shard


def _store(root: Path, *runs: tuple[str, int]) -> Path:
    for run_id, seed in runs:
        generate_run(root, run_id, seed=seed, calls=2)
    r = amb("ingest", "--store", str(root))
    assert r.exit_code == 0, r.output
    return root


def _refusals(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("amb: error: ")]


def test_run_folders_that_are_files_links_or_empty_are_refused_and_the_rest_loads(tmp_path):
    home = _store(tmp_path / "home", ("home-1", 1))
    other = _store(tmp_path / "other", ("good-1", 2))
    elsewhere = _store(tmp_path / "elsewhere", ("linked-1", 3))
    spool = other / "spool"
    (spool / "a-file").write_bytes(b"not a run folder")
    (spool / "linked-1").symlink_to(elsewhere / "spool" / "linked-1")  # a real run, outside the store
    (spool / "empty-1").mkdir()
    r = amb("ingest", "--store", str(home), "--from", str(other))
    assert r.exit_code == 1, r.output
    refused = _refusals(r.stderr)
    assert sorted(refused) == [
        f"amb: error: {spool / 'a-file'}: refused: not a folder (a symbolic link or a file)",
        f"amb: error: {spool / 'empty-1'}: refused: holds no spool of the run",
        f"amb: error: {spool / 'linked-1'}: refused: not a folder (a symbolic link or a file)",
    ], r.stderr
    assert sorted(event_hashes(home)) == ["good-1", "home-1"]
    assert sorted(p.name for p in (home / "spool").iterdir()) == ["good-1", "home-1"]
    assert amb("verify", "--store", str(home)).exit_code == 0


def test_a_store_run_whose_blobs_are_missing_is_refused_whole(tmp_path):
    home = _store(tmp_path / "home", ("home-1", 1))
    other = _store(tmp_path / "other", ("lost-1", 2))
    shutil.rmtree(other / "blobs")  # its spools refer to blobs that are nowhere
    before_files, before = files(home), event_hashes(home)
    r = amb("ingest", "--store", str(home), "--from", str(other), "--json")
    assert r.exit_code == 1, r.output
    ((where, why),) = json.loads(r.stdout)["sources"][0]["refused"]
    assert where == str(other / "spool" / "lost-1")
    assert why.startswith("spool/lost-1/") and "an event refers to blob sha256:" in why
    assert why.endswith("which neither it nor the store holds"), why
    assert files(home) == before_files and event_hashes(home) == before
    assert amb("verify", "--store", str(home)).exit_code == 0
    # From a store that has them, the very same run loads.
    whole = _store(tmp_path / "whole", ("lost-1", 2))
    r = amb("ingest", "--store", str(home), "--from", str(whole))
    assert r.exit_code == 0, r.output
    assert sorted(event_hashes(home)) == ["home-1", "lost-1"]
    assert amb("verify", "--store", str(home)).exit_code == 0


def test_a_shard_whose_blobs_are_missing_is_refused(tmp_path):
    layout = Layout(tmp_path / "sweep")
    layout.make()
    shard, _first = make_shard(layout, Cell("s", "agent", "bccd-det", "lite", 1), seed=4)
    # A shard rewritten without its blobs, its shard.json made to agree: every size still checks.
    shutil.rmtree(shard / "blobs")
    meta = json.loads((shard / SHARD_FILE).read_bytes())
    meta["files"] = {rel: n for rel, n in meta["files"].items() if not rel.startswith("blobs/")}
    (shard / SHARD_FILE).write_bytes(msgspec.json.encode(meta))
    home = _store(tmp_path / "home", ("home-1", 1))
    before_files = files(home)
    r = amb("ingest", "--store", str(home), "--from", str(layout.root))
    assert r.exit_code == 1, r.output
    (line,) = _refusals(r.stderr)
    assert line.startswith(f"amb: error: {shard}: refused: spool/{meta['run_id']}/"), line
    assert "an event refers to blob sha256:" in line
    assert files(home) == before_files
    assert amb("verify", "--store", str(home)).exit_code == 0


def _died_recorder_store(root: Path, run_id: str = "died-1") -> tuple[Path, dict[BlobRef, bytes]]:
    """A store with one un-ingested run whose recorder died before closing: the blobs its events
    refer to are only in the proxy's blob pack beside its spools."""
    contents = [b"request %d " % i * 50 for i in range(3)]
    w = BlobWriter(root / "blobs", pack_path(spool_path(root, run_id, "proxy")))
    refs = [w.put(c) for c in contents]
    with SpoolWriter(spool_path(root, run_id, "recorder"), run_id, "recorder") as recorder:
        recorder.append(RunStarted())
    with SpoolWriter(spool_path(root, run_id, "proxy"), run_id, "proxy") as spool:
        for ref in refs:
            spool.append(FileWritten(path="f", size=ref.size, sha256=ref.blob, content=ref))
    w.sync()
    os.close(w._fd)  # killed: no close(), so the pack stays beside the spools
    return root, dict(zip(refs, contents, strict=True))


def test_a_store_run_whose_blobs_are_in_a_recorders_pack_is_merged(tmp_path):
    home = _store(tmp_path / "home", ("home-1", 1))
    other, contents = _died_recorder_store(tmp_path / "other")
    r = amb("ingest", "--store", str(home), "--from", str(other))
    assert r.exit_code == 0, r.output
    assert sorted(event_hashes(home)) == ["died-1", "home-1"]
    with Store.open(home, read_only=True) as st:
        assert {ref: st.blobs.get(ref) for ref in contents} == contents
    assert amb("verify", "--store", str(home)).exit_code == 0


def _as_link(pack: Path, tmp: Path) -> None:
    outside = tmp / "outside.blobs"
    pack.rename(outside)
    pack.symlink_to(outside)


def _as_folder(pack: Path, tmp: Path) -> None:
    pack.unlink()
    pack.mkdir()


def _as_fifo(pack: Path, tmp: Path) -> None:
    pack.unlink()
    os.mkfifo(pack)


def _truncated(pack: Path, tmp: Path) -> None:
    pack.write_bytes(pack.read_bytes()[:-7])


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (_as_link, "proxy.blobs is a symbolic link"),
        (_as_folder, "proxy.blobs is a folder, not a spool or a blob pack"),
        (_as_fifo, "proxy.blobs is not a regular file or folder"),
        (_truncated, "spool/died-1/proxy.blobs is truncated (a blob record cut short at byte "),
    ],
)
def test_a_recorders_pack_that_is_not_a_whole_file_refuses_its_run(tmp_path, damage, why):
    home = _store(tmp_path / "home", ("home-1", 1))
    other, _contents = _died_recorder_store(tmp_path / "other")
    _store(other, ("good-1", 2))
    damage(other / "spool" / "died-1" / "proxy.blobs", tmp_path)
    before = event_hashes(home)
    r = amb("ingest", "--store", str(home), "--from", str(other))
    assert r.exit_code == 1, r.output
    (line,) = _refusals(r.stderr)
    assert line.startswith(f"amb: error: {other / 'spool' / 'died-1'}: refused: "), line
    assert why in line, line
    assert sorted(event_hashes(home)) == ["good-1", "home-1"]
    assert event_hashes(home)["home-1"] == before["home-1"]
    assert not (home / "spool" / "died-1").exists()
    assert amb("verify", "--store", str(home)).exit_code == 0
