"""`amb ingest --from` of another store or a sweep's shard that was damaged or crafted: run folders
that are files, links or empty, and runs whose events refer to blobs that came with nothing.

Each is refused with one line naming it (exit 1), nothing of it is copied, every other run loads,
and the store still passes `amb verify`. Runs are made by the real spool writer
(``recorder.synthetic``) and loaded by the real command.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec

from recorder.synthetic import generate_run
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
