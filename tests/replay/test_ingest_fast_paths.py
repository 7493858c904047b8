"""Ingest's fast paths refuse bad spools exactly as the full checks do.

A first ingest of runs the store has never seen skips the join with stored events (nothing can
conflict), and each row finds its spool's run, source and key by its file's index instead of
through a join. These tests load bad spools beside good ones in that path, in one batch, and check that
each is still refused by name, the good runs still load, and nothing of the bad one is stored.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from recorder.synthetic import generate_run
from replay.ingest import ingest, spool_files, spool_key
from replay.manifest import BLOB_MARK
from replay.store import Store
from replay.verify import verify
from schemas.codec import GENESIS, encode_payload, hash_body, make_body
from schemas.errors import SpoolError
from schemas.events import Note
from schemas.frames import MAGIC, encode_frame, scan


def note_body(run_id: str, source: str, seq: int, prev_hash: str, text: str = "x") -> bytes:
    return make_body(
        run_id=run_id,
        source=source,
        seq=seq,
        ts_ns=1_000 + seq,
        kind="note",
        v=1,
        payload=encode_payload(Note(text=text)),
        prev_hash=prev_hash,
    )


def chain(run_id: str, source: str, n: int) -> list[bytes]:
    """``n`` canonical, correctly chained bodies of one (run, source)."""
    bodies, prev = [], GENESIS
    for seq in range(n):
        body = note_body(run_id, source, seq, prev, f"note {seq}")
        bodies.append(body)
        prev = hash_body(body)
    return bodies


def write_spool(
    root, run_dir: str, source: str, bodies: list[bytes], digests: list[str] | None = None
) -> None:
    path = root / "spool" / run_dir / f"{source}.spool"
    path.parent.mkdir(parents=True, exist_ok=True)
    digests = digests or [hashlib.sha256(b).hexdigest() for b in bodies]
    path.write_bytes(MAGIC + b"".join(encode_frame(b, d) for b, d in zip(bodies, digests, strict=True)))


@pytest.fixture
def good_runs(tmp_path):
    """A store directory with four good runs' spools, none ingested yet."""
    root = tmp_path / "store"
    for i in range(4):
        generate_run(root, f"good-{i}", seed=i, calls=3)
    return root


def refused(root, match: str) -> None:
    with pytest.raises(SpoolError, match=match) as info:
        ingest(root, spool_mode="keep")
    report = info.value.report  # type: ignore[attr-defined]  # ingest attaches its report to the error
    assert report.runs == [f"good-{i}" for i in range(4)]
    with Store.open(root, read_only=True) as st:
        runs = [r[0] for r in st.con.execute("SELECT DISTINCT run_id FROM events ORDER BY 1").fetchall()]
    assert runs == [f"good-{i}" for i in range(4)]


def test_event_of_another_run_is_refused_by_its_spools_name(good_runs):
    bodies = chain("bad", "proxy", 3)
    bodies[1:] = chain("good-0", "proxy", 3)[1:]  # frames of another run, checksummed and canonical
    write_spool(good_runs, "bad", "proxy", bodies)
    refused(good_runs, "spool spool/bad/proxy.spool: seq 1: event belongs to good-0/proxy")


def test_event_of_another_source_is_refused(good_runs):
    write_spool(good_runs, "bad", "proxy", chain("bad", "shim", 2))
    refused(good_runs, "spool spool/bad/proxy.spool: seq 0: event belongs to bad/shim")


def test_duplicate_seq_in_a_new_run_is_refused(good_runs):
    bodies = chain("bad", "proxy", 3)
    write_spool(good_runs, "bad", "proxy", [*bodies, bodies[2]])
    refused(good_runs, "spool bad/proxy: duplicate seq")


def test_forked_chain_in_a_new_run_is_refused(good_runs):
    """Two histories spliced into one spool: every frame is sound alone, the link is not."""
    bodies = chain("bad", "proxy", 2) + [note_body("bad", "proxy", 2, hash_body(b"another history"))]
    write_spool(good_runs, "bad", "proxy", bodies)
    refused(good_runs, "spool bad/proxy: seq 2: broken chain")


def test_bad_checksum_in_a_new_run_is_refused(good_runs):
    bodies = chain("bad", "proxy", 3)
    digests = [hashlib.sha256(b).hexdigest() for b in bodies]
    digests[2] = hashlib.sha256(b"something else").hexdigest()
    write_spool(good_runs, "bad", "proxy", bodies, digests)
    refused(good_runs, "spool spool/bad/proxy.spool: seq 2: checksum mismatch")


def _frames(bodies: list[bytes], digests: list[str]) -> bytes:
    return b"".join(b"%d\t%s\t%s\n" % (len(b), d.encode(), b) for b, d in zip(bodies, digests, strict=True))


def test_hostile_frames_are_refused_by_the_checks_made_beside_the_statement(good_runs):
    """The checksums are checked in Python before the bulk statement (``replay.ingest_frames``),
    which must refuse what the statement's own check did: a digest in capitals (the stored hash
    would not be the one verify derives), digests whose characters were moved between two frames
    (each line's digest is compared, not their concatenation), and a frame whose body holds a CR
    and, after it, what looks like a whole frame (a reader that split lines at the CR would see two
    sound frames)."""
    bodies = chain("bad", "proxy", 3)
    digests = [hashlib.sha256(b).hexdigest() for b in bodies]
    cases = {
        "capitals": _frames(bodies, [digests[0], digests[1].upper(), digests[2]]),
        "moved": _frames(bodies, [digests[0], digests[1][:-1], digests[1][-1] + digests[2]]),
        "cr": _frames(bodies[:1], digests[:1])
        + b"%d\t%s\t%s\r%s\n"
        % (len(bodies[1]), digests[1].encode(), bodies[1], _frames(bodies[2:], digests[2:]).rstrip(b"\n")),
    }
    for name, frames in cases.items():
        path = good_runs / "spool" / "bad" / "proxy.spool"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(MAGIC + frames)
        with pytest.raises(SpoolError, match=r"spool spool/bad/proxy.spool: seq [1?]: ") as info:
            ingest(good_runs, spool_mode="keep")
        assert "checksum mismatch" in str(info.value) or "body has" in str(info.value), name
        with Store.open(good_runs, read_only=True) as st:
            stored = st.con.execute("SELECT count(*) FROM events WHERE run_id = 'bad'").fetchall()
        assert stored == [(0,)], name


def test_manifests_count_blob_references_as_the_store_does(good_runs):
    """A run new to the store gets its manifest's blob count from the spools ingest copied; it is
    the count the store's payloads give (what ``amb verify`` compares). A run whose spools arrive
    in two ingests is counted by the store (good-3: its recorder spool, with ``run.finished``,
    comes second)."""
    from replay.manifest import compute, stored
    from replay.verify import verify

    recorder = good_runs / "spool" / "good-3" / "recorder.spool"
    aside = good_runs / "recorder-of-good-3.spool"
    recorder.rename(aside)
    ingest(good_runs, spool_mode="keep")
    with Store.open(good_runs, read_only=True) as st:
        assert stored(st.con, "good-3") is None
    aside.rename(recorder)
    ingest(good_runs, spool_mode="keep")
    with Store.open(good_runs, read_only=True) as st:
        for i in range(4):
            kept = stored(st.con, f"good-{i}")
            assert kept is not None and kept["blob_refs"] > 0
            assert kept == compute(st.con, f"good-{i}")
        assert verify(st.con, st.blobs) == []


def test_a_spool_cut_inside_its_header_beside_a_new_runs_others(good_runs):
    """A producer that has not finished writing its spool's header leaves nothing to copy: the run's
    other spools load, its manifest counts their blob references, and the cut header is reported."""
    from replay.manifest import compute, stored

    (good_runs / "spool" / "good-0" / "late.spool").write_bytes(MAGIC[:5])
    report = ingest(good_runs, spool_mode="keep")
    assert [(t.path, t.tail.why if t.tail else None) for t in report.torn] == [
        ("spool/good-0/late.spool", "incomplete file header")
    ]
    with Store.open(good_runs, read_only=True) as st:
        kept = stored(st.con, "good-0")
        assert kept is not None and kept == compute(st.con, "good-0") and kept["blob_refs"] > 0


def _runs_with_many_spools(root) -> list:
    """More than 100 spools (ingest's progress comes every 100, before the batch is loaded)."""
    for i in range(36):
        generate_run(root, f"live-{i:02d}", seed=i, calls=1)
    paths = spool_files(root)
    assert len(paths) > 100
    return paths


def _next_frame(path) -> bytes:
    """A frame that continues this spool's chain: the first of its events with a blob reference,
    sent again under the next seq (its blob is in the store, so the store stays sound)."""
    bodies = scan(path.read_bytes()).bodies
    with_ref = next(b for b in bodies if BLOB_MARK.encode() in b)
    last = json.loads(bodies[-1])
    kind = json.loads(with_ref)["kind"]
    start = len(b'{"kind":"",' + b'"payload":') + len(kind)
    payload = with_ref[start : with_ref.rindex(b',"prev_hash":"')]
    body = make_body(
        run_id=last["run_id"],
        source=last["source"],
        seq=last["seq"] + 1,
        ts_ns=last["ts_ns"] + 1,
        kind=kind,
        v=json.loads(with_ref)["v"],
        payload=payload,
        prev_hash=hash_body(bodies[-1]),
    )
    return encode_frame(body, hashlib.sha256(body).hexdigest())


def _stored(root, path) -> int:
    with Store.open(root, read_only=True) as st:
        rows = st.con.execute(
            "SELECT count(*) FROM events WHERE run_id = ? AND source = ?", [path.parent.name, path.stem]
        ).fetchall()
    return int(rows[0][0])


@pytest.mark.parametrize("what", ["a whole frame", "half a frame"])
def test_a_spool_appended_to_while_ingest_reads_it(tmp_path, what):
    """DuckDB reads a finished spool where it lies. A producer still appending can change it between
    the look ``_prepare`` takes and the statement's read: a last line half written (which would read
    as a bad frame), or frames (whose blob references the manifest counts). Ingest loads such a spool
    again from a copy of its complete frames: no error, nothing half loaded, manifests sound; the rest
    of a half-written frame is loaded by the next ingest."""
    from replay.verify import verify

    root = tmp_path / "store"
    paths = _runs_with_many_spools(root)
    # The run still records: its recorder's spool holds the run.started written before the agent
    # started; the rest of it (run.finished with it) comes at the end.
    recorder = root / "spool" / "live-00" / "recorder.spool"
    aside = tmp_path / "recorder-of-live-00.spool"
    recorder.rename(aside)
    started = scan(aside.read_bytes()).bodies[0]
    recorder.write_bytes(MAGIC + encode_frame(started, hashlib.sha256(started).hexdigest()))
    target = next(
        p for p in paths[:100] if p.parent.name == "live-00" and BLOB_MARK.encode() in p.read_bytes()
    )
    frames_before = len(scan(target.read_bytes()).bodies)
    frame = _next_frame(target)
    cut = len(frame) if what == "a whole frame" else len(frame) // 2

    def progress(done: int, total: int) -> None:
        if done == 100:  # the first 100 spools are prepared, none is loaded yet
            with open(target, "ab") as f:
                f.write(frame[:cut])

    report = ingest(root, spool_mode="keep", progress=progress)
    assert report.failed == []
    assert _stored(root, target) == frames_before + (cut == len(frame))
    with Store.open(root, read_only=True) as st:
        assert verify(st.con, st.blobs) == []
    with open(target, "ab") as f:
        f.write(frame[cut:])  # the producer finishes its frame, then the run ends
    aside.rename(recorder)
    assert ingest(root, spool_mode="keep").failed == []
    assert _stored(root, target) == frames_before + 1
    with Store.open(root, read_only=True) as st:
        assert verify(st.con, st.blobs) == []
        refs = st.con.execute(
            "SELECT count(*) FROM events WHERE run_id = 'live-00' AND contains(payload, ?)", [BLOB_MARK]
        ).fetchall()
    assert refs[0][0] > 0


@pytest.mark.parametrize("chunk", [1, 7, 14, 15, 16, 100, 1 << 20])
def test_blob_marks_are_counted_across_chunk_boundaries(tmp_path, chunk):
    """``ingest_frames.check_spool`` reads a spool in chunks; a mark split between two is counted
    once, and every frame is checked once. The count is the whole file's (header line left out),
    whatever the chunk size."""
    from replay import ingest_frames

    root = tmp_path / "store"
    generate_run(root, "marks", seed=3, calls=4)
    spools = [p for p in spool_files(root) if BLOB_MARK.encode() in p.read_bytes()]
    assert spools
    for p in spools:
        checked = ingest_frames.check_spool(spool_key(root, p), str(p), chunk)
        assert checked.problem is None
        assert checked.marks == p.read_bytes().split(b"\n", 1)[1].count(BLOB_MARK.encode())


def test_a_batch_short_of_database_memory_is_loaded_again_with_more(tmp_path, monkeypatch, memory_growth):
    """Ingest runs under a small database memory limit. Started far below what a batch needs, the
    batch is loaded again with twice the limit until it fits: every event is stored, no spool is
    blamed for the database running short, and the limit is DuckDB's default again afterwards."""
    from replay import bounded
    from replay import ingest as ingest_mod

    for i in range(3):
        generate_run(tmp_path, f"run-{i}", seed=i, calls=12)
    monkeypatch.setattr(ingest_mod, "INGEST_MEMORY", 1 << 16)
    with Store.open(tmp_path) as st:
        default = bounded.memory_limit(st.con)
        report = ingest(store=st, spool_mode="keep")
        events = st.con.execute("SELECT count(*) FROM events").fetchall()[0][0]
        assert bounded.memory_limit(st.con) == default
    assert memory_growth, "the first limit was enough: the retry was not reached"
    assert report.failed == [] and report.events_added == events > 0
    assert sorted(report.runs) == ["run-0", "run-1", "run-2"]


def test_a_batch_is_read_from_a_few_frames_files(tmp_path, monkeypatch):
    """The bulk statement reads the batch's frames from the files the Python pass copies them to
    (``FRAMES_PART`` bytes or so each), not from each spool: a batch of many small spools is a few
    files. Each line is the spool's frame prefixed with the spool's index in the batch, and what is
    stored is what the spools hold, whatever the part size."""
    from replay import ingest as ingest_mod
    from replay import ingest_frames

    read: list[list[str]] = []
    insert = ingest_mod._insert

    def recording(con, sql, parts, readable):
        read.append(list(parts))
        index = {str(i): s for i, s in enumerate(readable)}
        for part in parts:
            for line in open(part, "rb").read().splitlines():
                i, frame = line.split(b"\t", 1)
                assert frame + b"\n" in open(index[i.decode()].readable, "rb").read()
        return insert(con, sql, parts, readable)

    monkeypatch.setattr(ingest_mod, "_insert", recording)
    for part_bytes in (1 << 20, 1):
        monkeypatch.setattr(ingest_frames, "FRAMES_PART", part_bytes)
        root = tmp_path / f"store-{part_bytes}"
        for i in range(4):
            generate_run(root, f"run-{i}", seed=i, calls=3)
        spools = spool_files(root)
        report = ingest(root, spool_mode="keep")
        assert report.files_loaded == len(spools)
        bodies = [b for p in spools for b in scan(p.read_bytes()).bodies]
        digests = sorted(f"sha256:{hashlib.sha256(b).hexdigest()}" for b in bodies)
        with Store.open(root, read_only=True) as st:
            hashes = st.con.execute("SELECT hash FROM events ORDER BY hash").fetchall()
            assert [h for (h,) in hashes] == digests
            assert verify(st.con, st.blobs) == []
    assert len(read[0]) == 1  # every spool of the batch in one file
    assert len(read[1]) == len(spools)  # a part per spool once each is past the size


def test_the_next_batch_s_frames_are_written_while_one_is_loaded(tmp_path, monkeypatch):
    """While the database loads a batch, a thread writes the next batch's frames files
    (``FramesAhead``), the first batch's too (written by the thread that loads, they took turns
    with the second batch's for the interpreter), and what is stored is every spool's frames,
    checked."""
    import threading

    from replay import ingest as ingest_mod
    from replay import ingest_frames

    on_main: list[bool] = []
    check = ingest_frames.check_batch

    def recording(spools, tmp):
        on_main.append(threading.current_thread() is threading.main_thread())
        return check(spools, tmp)

    monkeypatch.setattr(ingest_frames, "check_batch", recording)
    monkeypatch.setattr(ingest_mod, "BATCH_FILES", 2)
    for i in range(3):
        generate_run(tmp_path, f"run-{i}", seed=i, calls=2)
    spools = spool_files(tmp_path)
    batches = -(-len(spools) // 2)
    report = ingest(tmp_path, spool_mode="keep")
    assert report.files_loaded == len(spools) and batches > 2
    assert on_main == [False] * batches
    with Store.open(tmp_path, read_only=True) as st:
        assert st.con.execute("SELECT count(*) FROM events").fetchall()[0][0] == report.events_added
        assert verify(st.con, st.blobs) == []


def test_the_database_shares_the_cores_with_the_pass_writing_the_next_batch(tmp_path, monkeypatch):
    """Each batch's frames are written while the one before it loads, and while they are, the
    statement runs on one database thread fewer (the pass keeps a core busy), set back after it,
    also when a spool of that batch is refused. What is stored is every good spool's frames,
    checked."""
    import threading

    from replay import ingest as ingest_mod
    from replay import ingest_frames

    statements: list[tuple[int, int]] = []
    insert, check = ingest_mod._insert, ingest_frames.check_batch
    looked = [threading.Event() for _ in range(8)]  # by the statement of each whole batch
    passes: list[int] = []

    def recording(con, sql, parts, readable):
        threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
        statements.append((len(readable), int(threads)))
        if len(readable) > 1:  # (a whole batch: a spool loaded alone is one)
            looked[sum(n > 1 for n, _ in statements) - 1].set()
        return insert(con, sql, parts, readable)

    def checking(spools, tmp):
        if threading.current_thread() is not threading.main_thread():  # (a spool alone: written now)
            passes.append(len(passes))
            if passes[-1]:  # (the first batch's is waited for) still writing when the one before starts
                looked[passes[-1] - 1].wait(60)
        return check(spools, tmp)

    monkeypatch.setattr(ingest_mod, "_insert", recording)
    monkeypatch.setattr(ingest_frames, "check_batch", checking)
    monkeypatch.setattr(ingest_mod, "BATCH_FILES", 8)
    for i in range(6):
        generate_run(tmp_path, f"run-{i}", seed=i, calls=2)
    spools = spool_files(tmp_path)
    assert len(spools) > 10
    bad = spools[0]  # (in the first batch) an edited event: checksum sound, body not canonical
    lines = bad.read_bytes().split(b"\n")
    body = lines[1].split(b"\t", 2)[2].replace(b'{"kind"', b'{ "kind"', 1)
    lines[1] = b"%d\t%s\t%s" % (len(body), hashlib.sha256(body).hexdigest().encode(), body)
    bad.write_bytes(b"\n".join(lines))
    with Store.open(tmp_path) as st:
        st.con.execute("SET threads = 3")
        with pytest.raises(SpoolError, match="not a canonical event body") as refused:
            ingest(store=st, spool_mode="keep")
        assert st.con.execute("SELECT current_setting('threads')").fetchall()[0][0] == 3
        assert {(p.run_id, p.source) for p in verify(st.con, st.blobs)} == {(bad.parent.name, bad.stem)}
    report = refused.value.report  # type: ignore[attr-defined]  # ingest attaches its report to the error
    assert report.files_loaded == len(spools) - 1 and [key for key, _ in report.failed] == [
        bad.relative_to(tmp_path).as_posix()
    ]
    # the first batch whole, refused, then each of its spools alone; then the later batches
    sizes = [n for n, _ in statements]
    assert sizes[:9] == [8] + [1] * 8 and set(sizes[9:-1]) == {8} and sum(sizes[9:]) == len(spools) - 8
    # (a spool loaded alone after the refusal: with the next batch's pass running or done)
    assert [t for _, t in statements[:1] + statements[9:]] == [2] * (len(statements) - 9) + [3]
