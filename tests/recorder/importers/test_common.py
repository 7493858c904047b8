"""The importers' shared parts: the inside-the-folder check and the staged, batched write.

- ``inside`` answers as a full resolve would for plain paths, links that stay inside, links that
  lead out (a file, a folder on the way), ``..`` and missing paths.
- A staged run is invisible (``.partial``) until published; the spool built in one buffer is the
  one ``SpoolWriter`` appends event by event, byte for byte; published runs ingest and verify.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recorder.importers.common import (
    SOURCE,
    RunBuilder,
    inside,
    publish,
    spool_bytes,
    stage,
)
from recorder.spool import SpoolWriter
from replay.ingest import ingest
from replay.store import Store
from replay.verify import verify
from schemas.events import Note, RunFinished, RunStarted
from schemas.run_claim import held_spools


def full_resolve(root: Path, path: Path) -> bool:
    try:
        path.resolve(strict=True).relative_to(root)
    except (ValueError, OSError):
        return False
    return True


def test_inside_agrees_with_a_full_resolve(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    root = (tmp_path / "run").resolve()
    (root / "process" / "deep").mkdir(parents=True)
    (root / "process" / "trace.jsonl").write_text("{}\n")
    (root / "process" / "deep" / "f").write_text("x")
    (root / "link-in").symlink_to(root / "process" / "trace.jsonl")
    (root / "link-out").symlink_to(outside / "secret")
    (root / "dir-out").symlink_to(outside, target_is_directory=True)
    (root / "dir-in").symlink_to(root / "process", target_is_directory=True)
    cases = {
        root / "process" / "trace.jsonl": True,
        root / "process" / "deep" / "f": True,
        root / "process" / "." / "trace.jsonl": True,
        root / "link-in": True,
        root / "dir-in" / "trace.jsonl": True,
        root / "link-out": False,
        root / "dir-out" / "secret": False,
        root / "process" / ".." / ".." / "outside" / "secret": False,
        root / "process" / "missing": False,
        outside / "secret": False,
    }
    for path, want in cases.items():
        assert inside(root, path) is want, path
        assert full_resolve(root, path) is want, path


def _run(run_id: str, n: int = 5) -> RunBuilder:
    b = RunBuilder(run_id)
    b.emit(RunStarted(task="kidney-seg", tier="lite", agent="a", model="m", backend="import"), 1_000)
    for i in range(n):
        b.emit(Note(text=f"note {i}", data={"kind": "x", "blob": b.json_blob({"i": i}).blob}), 2_000 + i)
    b.emit(RunFinished(status="completed", exit_code=0), 9_000)
    return b


def test_spool_in_one_buffer_is_what_the_writer_appends(tmp_path):
    run = _run("r-bytes")
    path = tmp_path / "w.spool"
    with SpoolWriter(path, run.run_id, SOURCE, sync=False) as w:
        for ts, payload in run.events:
            w.append(payload, ts_ns=ts)
    assert spool_bytes(run) == path.read_bytes()


@pytest.mark.parametrize("publish_them", [False, True])
def test_staged_runs_are_invisible_until_published(tmp_path, publish_them):
    store = tmp_path / "store"
    staged = [stage(store, _run(f"r-{i}"), spool_bytes(_run(f"r-{i}"))) for i in range(3)]
    assert all(s.partial.exists() and not s.final.exists() for s in staged)
    assert not any(held_spools(store, f"r-{i}") for i in range(3))
    if publish_them:
        assert publish(store, staged) == []
        assert all(s.final.exists() and not s.partial.exists() for s in staged)
        assert all(held_spools(store, f"r-{i}") == {"import": s.final} for i, s in enumerate(staged))
    ingest(store)
    with Store.open(store, read_only=True) as st:
        runs = {r[0] for r in st.con.execute("SELECT run_id FROM runs").fetchall()}
        assert runs == ({"r-0", "r-1", "r-2"} if publish_them else set())
        if publish_them:
            assert verify(st.con, st.blobs) == []
    if not publish_them:
        # What a crash before publishing leaves: only .partial files; the next import of the run
        # removes those of processes that are gone, and writes its own.
        dead = staged[0].partial.with_name("import.spool.999999999.partial")
        os.replace(staged[0].partial, dead)
        again = stage(store, _run("r-0", n=2), spool_bytes(_run("r-0", n=2)))
        assert again.partial.read_bytes() == spool_bytes(_run("r-0", n=2))
        assert not os.path.exists(again.final) and not dead.exists()
