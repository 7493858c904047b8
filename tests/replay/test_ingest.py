"""Ingest: bulk, idempotent, verifying checksums and chains, reporting torn tails."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay.ingest import ingest, spool_files
from replay.read import iter_events
from replay.store import Store
from replay.verify import verify
from schemas.codec import GENESIS, encode_payload, make_body
from schemas.errors import IngestConflict, SchemaError, SpoolError
from schemas.events import Note
from schemas.frames import MAGIC, encode_frame
from schemas.ostext import os_bytes

GOLDEN = Path(__file__).parents[1] / "data" / "golden" / "v1-store"
GOLDEN_NAMES = Path(__file__).parents[1] / "data" / "golden" / "v1-names-store"


def count(root) -> int:
    with Store.open(root, read_only=True) as st:
        return st.con.execute("SELECT count(*) FROM events").fetchall()[0][0]


@pytest.fixture
def compressed(tmp_path):
    """Three runs ingested with their spools compressed, whatever AMB_SPOOLS says (with ``drop``
    there would be no spools to read back, which is what these tests do)."""
    root = tmp_path / "store"
    for i in range(3):
        generate_run(root, f"run-{i}", seed=i, calls=12)
    ingest(root, spool_mode="compress")
    return root


def test_ingest_loads_every_event(compressed):
    store = compressed
    with Store.open(store, read_only=True) as st:
        per_run = dict(st.con.execute("SELECT run_id, count(*) FROM events GROUP BY 1").fetchall())
        spooled: dict[str, Any] = {}
        # (ingest compressed the spools of these finished runs: read them through it)
        for f in spool_files(store):
            from replay.spools import read_bytes
            from schemas.frames import scan

            spooled[f.parent.name] = spooled.get(f.parent.name, 0) + len(scan(read_bytes(f)).bodies)
    assert per_run == spooled and len(per_run) == 3


def test_reingest_adds_nothing(compressed):
    store = compressed
    before = count(store)
    again = ingest(store)
    assert (again.files_loaded, again.events_added) == (0, 0)
    # Even when the bookkeeping is gone and every file is read again, nothing is added.
    with Store.open(store) as st:
        st.con.execute("DELETE FROM spool_files")
    again = ingest(store)
    assert again.files_loaded == 9 and again.events_added == 0 and count(store) == before


def test_growing_spool_adds_only_new_events(tmp_path):
    root = tmp_path / "s"
    w = SpoolWriter(spool_path(root, "live", "proxy"), "live", "proxy")
    w.append(Note(text="one"))
    assert ingest(root).events_added == 1
    w.append(Note(text="two"))
    w.append(Note(text="three"))
    assert ingest(root).events_added == 2
    w.close()
    with Store.open(root, read_only=True) as st:
        notes = [e.payload for e in iter_events(st.con, "live")]
        assert [n.text for n in notes if isinstance(n, Note)] == ["one", "two", "three"]


def test_torn_tail_is_reported_and_earlier_frames_kept(tmp_path):
    root = tmp_path / "s"
    w = SpoolWriter(spool_path(root, "r", "proxy"), "r", "proxy")
    for i in range(5):
        w.append(Note(text=f"n{i}"))
    w.close()
    path = spool_path(root, "r", "proxy")
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # what a writer killed in the middle of its last frame leaves
    report = ingest(root)
    assert report.events_added == 4
    assert report.torn[0].tail is not None
    assert (
        len(report.torn) == 1
        and report.torn[0].frames == 4
        and report.torn[0].tail.why == "incomplete last frame"
    )


def test_forked_spool_is_a_conflict(tmp_path):
    root = tmp_path / "s"
    with SpoolWriter(spool_path(root, "r", "proxy"), "r", "proxy") as w:
        w.append(Note(text="original"))
    ingest(root)
    shutil.rmtree(root / "spool")
    with SpoolWriter(spool_path(root, "r", "proxy"), "r", "proxy") as w:
        w.append(Note(text="rewritten history"))
    with pytest.raises(IngestConflict, match="spool spool/r/proxy.spool: seq 0: the spool differs"):
        ingest(root)
    assert count(root) == 1


def test_unknown_kind_in_a_spool_is_a_clear_error(tmp_path):
    root = tmp_path / "s"
    with SpoolWriter(spool_path(root, "r", "proxy"), "r", "proxy") as w:
        w.append_encoded("judge.verdict", 1, b'{"kind":"judge.verdict"}')
    with pytest.raises(SchemaError, match="unknown event kind judge.verdict"):
        ingest(root)


def test_newer_version_in_a_spool_is_a_clear_error(tmp_path):
    root = tmp_path / "s"
    with SpoolWriter(spool_path(root, "r", "proxy"), "r", "proxy") as w:
        w.append_encoded("note", 9, b'{"kind":"note","text":"from the future"}')
    with pytest.raises(SchemaError, match="note v9 is newer than this amb"):
        ingest(root)


def test_edited_spool_frame_is_refused(tmp_path):
    root = tmp_path / "s"
    with SpoolWriter(spool_path(root, "r", "proxy"), "r", "proxy") as w:
        for i in range(3):
            w.append(Note(text=f"note {i}"))
    path = spool_path(root, "r", "proxy")
    data = bytearray(path.read_bytes())
    i = data.index(b"note 0")
    data[i] = ord("N")  # checksum of frame 0 no longer matches, and more frames follow
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolError, match="spool spool/r/proxy.spool: seq 0: checksum mismatch"):
        ingest(root)
    assert count(root) == 0


@pytest.mark.parametrize(
    "edit",
    [
        lambda body: body.replace(b',"v":1}', b', "v":1}'),  # whitespace
        lambda body: body.replace(b'"ts_ns":1,', b'"ts_ns":1.0,'),  # a number not in its canonical form
        lambda body: b'{"payload":' + body.split(b',"payload":', 1)[1][:-1] + b',"kind":"note"}',  # key order
    ],
    ids=["whitespace", "number-form", "key-order"],
)
def test_body_that_is_not_canonical_is_refused(tmp_path, edit):
    """A frame whose checksum is right but whose body is not the canonical encoding would store a
    hash that ``amb verify`` can never reproduce from the columns: ingest refuses it."""
    root = tmp_path / "s"
    body = make_body(
        run_id="r",
        source="proxy",
        seq=0,
        ts_ns=1,
        kind="note",
        v=1,
        payload=encode_payload(Note(text="x")),
        prev_hash=GENESIS,
    )
    bad = edit(body)
    assert bad != body and json.loads(bad) == json.loads(body)
    path = spool_path(root, "r", "proxy")
    path.parent.mkdir(parents=True)
    path.write_bytes(MAGIC + encode_frame(bad, hashlib.sha256(bad).hexdigest()))
    with pytest.raises(
        SpoolError, match="spool spool/r/proxy.spool: seq (0|\\?): not a canonical event body"
    ):
        ingest(root)
    assert count(root) == 0


def test_golden_v1_log_is_upcast(tmp_path):
    root = tmp_path / "s"
    shutil.copytree(GOLDEN, root)
    assert ingest(root).events_added == 4
    with Store.open(root, read_only=True) as st:
        notes = [e for e in iter_events(st.con, "golden-v1") if e.kind == "note"]
        # Stored as written (v1); read back as the current version.
        assert {e.v for e in notes} == {1}
        assert [e.payload for e in notes] == [Note(text="written by note v1"), Note(text="café ✓")]
        assert st.con.execute("SELECT count(*) FROM manifests").fetchall()[0][0] == 1


def test_golden_v1_names_read_as_the_names_they_recorded(tmp_path):
    """v1 held OS strings as plain text, backslashes and all; read today, each is the recorded text
    (``schemas.ostext``) of the name v1 stored, and the stored bytes still verify."""
    root = tmp_path / "s"
    shutil.copytree(GOLDEN_NAMES, root)
    before = {p.name: p.read_bytes() for p in (root / "spool" / "golden-v1-names").iterdir()}
    assert ingest(root, spool_mode="keep").events_added == 11
    with Store.open(root, read_only=True) as st:
        assert verify(st.con, st.blobs) == []
        events = list(iter_events(st.con, "golden-v1-names"))
    assert {p.name: p.read_bytes() for p in (root / "spool" / "golden-v1-names").iterdir()} == before
    assert {(e.kind, e.v) for e in events if e.kind != "run.finished"} == {
        (k, 1)
        for k in (
            "run.started",
            "process.exited",
            "submission.sealed",
            "file.written",
            "file.renamed",
            "file.deleted",
            "file.accessed",
        )
    }
    by_kind: dict[str, list[Any]] = {}
    for e in events:
        by_kind.setdefault(e.kind, []).append(e.payload)
    started = by_kind["run.started"][0]
    # What v1 stored (raw strings here: each backslash is one the name had), read back exactly.
    assert [os_bytes(a) for a in started.command] == [b"sh", b"-c", rb"printf 'a\\b' > 'x\\y.txt'"]
    assert os_bytes(started.workspace) == rb"/home/u/work\space"
    assert [os_bytes(p.path) for p in by_kind["file.written"]] == [rb"x\y.txt", rb"\xff.txt"]
    renames = [(os_bytes(p.src), os_bytes(p.dst)) for p in by_kind["file.renamed"]]
    assert renames == [(rb"\xff.txt", rb"\\.txt"), (rb"\\.txt", rb"\xff.txt")]
    assert by_kind["file.renamed"][0].src == r"\\xff.txt"  # the name, not the byte 0xff
    sealed = by_kind["submission.sealed"][0]
    assert [os_bytes(f.path) for f in sealed.files] == [rb"x\y.txt", rb"\xff.txt", "café.txt".encode()]
    assert sealed.skipped == [r"l\\ink: symlink"]
    shim_procs = [p for p in by_kind["process.exited"] if p.tracer == "strace"]
    assert [[os_bytes(a) for a in p.argv] for p in shim_procs] == [[b"printf", rb"a\b"]]


def test_concurrent_writers_wait_for_the_lock(tmp_path):
    """Two processes ingesting into one store at once both succeed (the second waits)."""
    import subprocess
    import sys

    root = tmp_path / "s"
    for i in range(4):
        generate_run(root, f"r{i}", seed=i, calls=5)
    code = "import sys; from replay.ingest import ingest; ingest(sys.argv[1], [sys.argv[2]])"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(root), f"r{i}"], cwd=Path(__file__).parents[2])
        for i in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    with Store.open(root, read_only=True) as st:
        assert st.con.execute("SELECT count(DISTINCT run_id) FROM events").fetchall()[0][0] == 4


def test_one_corrupt_spool_does_not_keep_the_others_out(tmp_path):
    """Three valid runs and one corrupt spool: the valid ones load, the bad one is named, and the
    error is still raised (it once made ingest load nothing at all)."""
    root = tmp_path / "s"
    for i in range(3):
        generate_run(root, f"good-{i}", seed=i, calls=4)
    with SpoolWriter(spool_path(root, "bad", "proxy"), "bad", "proxy") as w:
        for i in range(3):
            w.append(Note(text=f"note {i}"))
    path = spool_path(root, "bad", "proxy")
    data = bytearray(path.read_bytes())
    data[data.index(b"note 1")] = ord("N")
    path.write_bytes(bytes(data))
    (root / "spool" / "junk").mkdir()
    (root / "spool" / "junk" / "proxy.spool").write_bytes(b"this is not a spool\n")
    with pytest.raises(SpoolError, match="checksum mismatch|bad magic") as info:
        ingest(root)
    report = info.value.report  # type: ignore[attr-defined]  # ingest attaches its report to the error
    assert report.runs == ["good-0", "good-1", "good-2"]
    assert sorted(k for k, _ in report.failed) == ["spool/bad/proxy.spool", "spool/junk/proxy.spool"]
    assert "and 1 more bad spools" in str(info.value)
    with Store.open(root, read_only=True) as st:
        runs = [r[0] for r in st.con.execute("SELECT DISTINCT run_id FROM events ORDER BY 1").fetchall()]
    assert runs == ["good-0", "good-1", "good-2"]


def test_amb_ingest_names_the_bad_spool_and_exits_non_zero(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "s"
    generate_run(root, "good", seed=1, calls=2)
    (root / "spool" / "broken").mkdir()
    (root / "spool" / "broken" / "proxy.spool").write_bytes(b"garbage\n")
    amb = str(Path(sys.executable).with_name("amb"))
    proc = subprocess.run([amb, "ingest", "--store", str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "runs: 1" in proc.stdout
    assert "amb: error: spool/broken/proxy.spool: not loaded:" in proc.stderr and "bad magic" in proc.stderr


def test_a_linked_run_folder_or_a_fifo_spool_is_refused_and_nothing_outside_is_touched(tmp_path):
    """A store's spool/ holding a link to a folder elsewhere (a store copied from someone else, or
    made by hand) and a FIFO named like a spool: each is named and not loaded; ingest never
    compresses or removes files outside the store, nor waits on the FIFO; the other run loads."""
    from click.testing import CliRunner

    from amb.main import cli

    root, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    generate_run(root, "run-home", seed=1, calls=2)
    generate_run(elsewhere, "run-away", seed=2, calls=2)
    outside = elsewhere / "spool" / "run-away"
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    (root / "spool" / "run-away").symlink_to(outside)
    r = CliRunner().invoke(cli, ["ingest", "--store", str(root), "--spools", "drop"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    for source in sorted(before):
        link = root / "spool" / "run-away" / source
        assert f"{link}: its run folder is a symbolic link" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
    fifo = root / "spool" / "run-home" / "extra.spool"
    os.mkfifo(fifo)
    r = CliRunner().invoke(cli, ["ingest", "--store", str(root), "run-home"])
    assert r.exit_code == 1 and r.stderr.startswith(
        f"amb: error: spool/run-home/extra.spool: not loaded: {fifo}"
    )
    assert f"{fifo}: not a regular file" in r.stderr
    fifo.unlink()
    assert ingest(root, run_ids=["run-home"]).failed == []
    with Store.open(root, read_only=True) as st:
        assert [r for (r,) in st.con.execute("SELECT DISTINCT run_id FROM events").fetchall()] == ["run-home"]


def test_spool_files_lists_each_run_s_spools_and_packs_by_name(tmp_path):
    """The spools ingest reads (a compressed one only where its plain spool is gone) and the blob
    packs beside them, by name: hidden files, other names and a RUN that is no folder are not."""
    from schemas.blobpack import SUFFIX, packs_in

    run = tmp_path / "spool" / "run-a"
    run.mkdir(parents=True)
    for name in ("b.spool", "a.spool", "a.spool.zst", "c.spool.zst", ".h.spool", "x.txt", "p" + SUFFIX):
        (run / name).write_bytes(b"")
    (tmp_path / "spool" / "run-b").write_bytes(b"")  # not a folder
    expected = [run / "a.spool", run / "b.spool", run / "c.spool.zst"]
    assert spool_files(tmp_path) == expected
    assert spool_files(tmp_path, ["run-a", "run-b", "run-c"]) == expected
    assert list(packs_in(run)) == [run / ("p" + SUFFIX)]
    assert list(packs_in(tmp_path / "spool" / "run-c")) == []
