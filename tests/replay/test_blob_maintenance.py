"""``amb blobs migrate`` (loose files -> packs, killed and resumed) and ``amb gc --blobs`` (never a
referenced blob, not even beside a concurrent ingest)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from recorder.synthetic import generate_run
from replay.blob_gc import collect
from replay.blob_migrate import migrate
from replay.ingest import ingest
from replay.store import Store
from replay.verify import verify
from schemas.blob import BlobRef
from schemas.blobstore import BlobStore
from schemas.errors import BlobError
from tests.fakes.old_store import explode

AMB = str(Path(sys.executable).parent / "amb")


def amb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([AMB, *args], capture_output=True, text=True, timeout=300)


def all_refs(root) -> list[str]:
    with Store.open(root, read_only=True) as st:
        rows = st.con.execute(
            'SELECT DISTINCT unnest(regexp_extract_all(payload, \'"blob":"(sha256:[0-9a-f]{64})"\', 1)) '
            "FROM events"
        ).fetchall()
    return sorted(r[0] for r in rows)


def problems(root) -> list[str]:
    with Store.open(root, read_only=True) as st:
        return [str(p) for p in verify(st.con, st.blobs)]


@pytest.fixture
def old_store(store_templates, tmp_path):
    """A store as amb wrote it before packs: three ingested runs, one loose file per blob."""
    import shutil

    root = tmp_path / "old"
    shutil.copytree(store_templates["packed"], root, symlinks=True)
    blobs = BlobStore(root / "blobs")
    explode(blobs)
    return root


def test_migrate_packs_every_loose_blob_and_checks_it(old_store):
    blobs = BlobStore(old_store / "blobs")
    refs = all_refs(old_store)
    before = {r: blobs.get(r) for r in refs}
    n_loose = len(list(blobs.loose_files()))
    bad = next(p for p in blobs.loose_files())  # a damaged loose file: named, kept, not packed
    os.chmod(bad, 0o644)
    bad.write_bytes(b"\x78\x9c" + b"garbage")
    blobs.forget()
    done = migrate(blobs)
    assert done.packed == n_loose - 1 and len(done.bad) == 1 and bad.name in done.bad[0]
    assert list(blobs.loose_files()) == [bad]
    blobs.forget()
    for r, data in before.items():
        if bad.parent.name + bad.name != r[7:]:
            assert blobs.get(r) == data
    assert blobs.usage().pack_disk < n_loose * 4096 / 2  # one file, not a 4 KiB block per blob


def test_a_folder_or_fifo_where_a_loose_blob_goes_is_named_by_every_command(old_store):
    """What stands where a loose blob file goes may be anything: a folder or a FIFO (whose read
    would wait for a writer forever) is a damaged blob to `amb blobs migrate` and `amb verify`, each
    naming it, and is kept by `amb gc --blobs`; never a traceback or a hang."""
    blobs = BlobStore(old_store / "blobs")
    folder, fifo = sorted(blobs.loose_files())[:2]
    for path in (folder, fifo):
        os.chmod(path, 0o644)
        path.unlink()
    folder.mkdir()
    os.mkfifo(fifo)
    unreferenced = blobs.root / "ab" / ("c" * 62)
    unreferenced.mkdir(parents=True)
    for args in (("gc", "--blobs"), ("blobs", "migrate"), ("verify",)):
        done = subprocess.run(
            [AMB, *args, "--store", str(old_store)], capture_output=True, text=True, timeout=120
        )
        out = done.stdout + done.stderr
        assert done.returncode == 1 and "Traceback" not in out, (args, out)
        if args[0] == "gc":  # live blobs it keeps whatever their state (verify names the damage)
            left = f"amb: error: ab/{'c' * 62} left as it is: a folder where a blob file goes\n"
            assert done.stderr == left
            continue
        for path in (folder, fifo):
            name = path.parent.name + path.name
            assert f"blob sha256:{name} is corrupted (its file is not a regular file)" in out, (args, out)
    assert folder.is_dir() and unreferenced.is_dir()


def test_killed_migration_resumes_and_loses_nothing(old_store):
    """kill -9 of the migration between two of its commits: the second batch's records are durable
    (flushed), the first batch's loose files removed, the second's not yet. The child waits there
    for the kill (a kill timed by polling could land after the migration had finished)."""
    blobs = BlobStore(old_store / "blobs")
    refs = all_refs(old_store)
    before = {r: blobs.get(r) for r in refs}
    n_loose = len(list(blobs.loose_files()))
    script = (
        "import sys, time, replay.blob_migrate as m; from schemas.blobstore import BlobStore\n"
        "m.BATCH_BYTES = 2048  # commit (fsync, then remove the loose files) very often\n"
        "store = BlobStore(sys.argv[1]); flush = store.flush; flushed = []\n"
        "def flush_then_wait():\n"
        "    flush(); flushed.append(1)\n"
        "    if len(flushed) == 2: print('flushed', flush=True); time.sleep(600)\n"
        "store.flush = flush_then_wait\n"
        "m.migrate(store)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(old_store / "blobs")], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "flushed\n", "the migration ended before its second commit"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = len(list(blobs.loose_files()))
    assert 0 < left < n_loose, "the kill landed mid-migration"
    blobs.forget()
    assert {r: blobs.get(r) for r in refs} == before  # killed: every blob still reads (loose or packed)
    done = migrate(blobs)
    assert done.bad == [] and list(blobs.loose_files()) == []
    assert done.packed + done.already == left
    blobs.forget()
    assert {r: blobs.get(r) for r in refs} == before
    assert problems(old_store) == []


def test_cli_migrate_then_verify(old_store):
    out = amb("blobs", "migrate", "--store", str(old_store), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["bad"] == [] and report["usage"]["loose_files"] == 0 and report["usage"]["packs"] == 1
    verified = amb("verify", "--store", str(old_store))
    assert verified.returncode == 0 and verified.stdout.startswith("OK"), verified.stdout
    missing = amb("blobs", "migrate", "--store", str(old_store / "nope"))
    assert missing.returncode == 3 and missing.stderr.startswith("amb: error: no store at")


def test_gc_drops_only_unreferenced_blobs(store):
    blobs = BlobStore(store / "blobs")
    referenced = all_refs(store)
    orphans = [blobs.put(b"orphan %d" % i).blob for i in range(30)]
    pending = generate_run(store, "run-pending", seed=9, calls=5)  # recorded, not yet ingested
    assert pending.blobs > 0
    with Store.open(store) as st:  # a reference from another table (a judge's evidence, say)
        st.con.execute("CREATE TABLE side (note VARCHAR)")
        st.con.execute("INSERT INTO side VALUES (?)", [f"evidence at {orphans[0]}"])
    blobs.close()
    done = collect(blobs, store / "spool", lambda: Store.open(store, read_only=True).con)
    assert done.problems == [] and done.removed == len(orphans) - 1
    assert blobs.check(orphans[0]) is None
    assert all("missing" in (blobs.check(o) or "") for o in orphans[1:])
    assert all(blobs.check(r) is None for r in referenced)
    assert done.packs_after == 1  # small packs were merged
    ingest(store)
    assert problems(store) == []
    again = collect(blobs, store / "spool", lambda: Store.open(store, read_only=True).con)
    assert again.removed == 0


def test_gc_reports_what_it_freed_when_a_pack_had_lost_its_index(store, tmp_path):
    """A pack without its index (a gc killed between removing the two) is rewritten with one: that
    index repairs the store and is no cost of collecting, so the bytes reported freed are those of a
    store that had it, never a negative count."""
    import shutil

    healthy = tmp_path / "healthy"
    shutil.copytree(store, healthy, symlinks=True)
    blobs = BlobStore(store / "blobs")
    blobs.close()
    pack = min(blobs.pack_files())
    pack.with_suffix(".idx").unlink()
    done = amb("gc", "--blobs", "--store", str(store))
    assert done.returncode == 0, done.stderr
    expected = json.loads(amb("gc", "--blobs", "--store", str(healthy), "--json").stdout)
    assert expected["reclaimed"] >= 0
    assert done.stdout.startswith(f"0 unreferenced blobs removed ({expected['reclaimed']} bytes); ")
    assert expected["indexes_rebuilt"] == 0
    assert done.stdout.rstrip().endswith("; 1 pack(s) without their index rewritten"), done.stdout
    blobs.forget()
    assert all(p.with_suffix(".idx").exists() for p in blobs.pack_files())
    assert problems(store) == []


def test_gc_waits_for_writers_and_never_races_an_ingest(store_templates, tmp_path):
    """A recording writer holds the store: gc refuses (it never guesses). Then gc and an ingest of
    fresh spools race in two processes; whatever the order, every referenced blob survives."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(store_templates["packed"], store, symlinks=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from schemas.blobstore import BlobStore\n"
            "blobs = BlobStore(sys.argv[1]); blobs.put(b'live'); print('ready', flush=True); time.sleep(60)",
            str(store / "blobs"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    blobs = BlobStore(store / "blobs")
    try:
        with pytest.raises(BlobError, match="blob writers are active"):
            collect(blobs, store / "spool", lambda: Store.open(store, read_only=True).con, wait_s=0.5)
    finally:
        holder.kill()
        holder.wait()
    for i in range(4):
        generate_run(store, f"run-new-{i}", seed=20 + i, calls=8)
    for i in range(40):
        blobs.put(b"garbage %d" % i)
    blobs.close()
    ingester = subprocess.Popen([AMB, "ingest", "--store", str(store)])
    gc = amb("gc", "--blobs", "--store", str(store), "--json", "--wait", "60")
    assert ingester.wait(timeout=300) == 0
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["removed"] >= 40
    assert problems(store) == []
    assert len(all_refs(store)) > 0


@pytest.mark.parametrize("point", ["mid-repack", "new-pack-sealed", "old-index-removed"])
def test_gc_killed_mid_repack_loses_nothing_and_a_rerun_completes(store_templates, tmp_path, point):
    """kill -9 of ``amb gc --blobs`` at a chosen point of its repack (tests/fakes/gc_killer.py):
    every referenced blob still reads and verifies; a second gc completes and drops the orphans."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(store_templates["packed"], store, symlinks=True)
    blobs = BlobStore(store / "blobs")
    refs = all_refs(store)
    before = {r: blobs.get(r) for r in refs}
    orphans = [blobs.put(b"orphan %d" % i).blob for i in range(30)]
    blobs.close()
    packs_before = {p.name for p in blobs.pack_files()}
    killed = subprocess.run(
        [sys.executable, "-m", "tests.fakes.gc_killer", point, str(store)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    packs = blobs.pack_files()
    new = [p for p in packs if p.name not in packs_before]
    assert len(new) == 1, "the kill landed during the repack: its new pack is there"
    if point == "old-index-removed":  # the kill landed between an old index and its pack
        assert any(not p.with_suffix(".idx").exists() for p in packs)
    else:
        assert {p.name for p in packs} >= packs_before  # no old pack removed yet
    blobs.forget()
    assert {r: blobs.get(r) for r in refs} == before  # killed: every referenced blob still reads
    assert problems(store) == []
    # The rerun: first with no pack counted as small, so only packs that must change are rewritten
    # (a pack left without its index among them); then the command itself, to the end.
    blobs.forget()
    done = collect(blobs, store / "spool", lambda: Store.open(store, read_only=True).con, small_pack=1)
    assert done.problems == []
    blobs.forget()
    assert {r: blobs.get(r) for r in refs} == before
    assert all("missing" in (blobs.check(o) or "") for o in orphans)
    assert all(p.with_suffix(".idx").exists() for p in blobs.pack_files())
    assert problems(store) == []
    again = amb("gc", "--blobs", "--store", str(store), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["problems"] == []
    blobs.forget()
    assert {r: blobs.get(r) for r in refs} == before
    assert len(blobs.pack_files()) == 1
    assert problems(store) == []


def test_gc_keeps_the_bases_of_live_deltas(store):
    """A delta's base (and the base's base) stays while the delta is referenced, even when nothing
    else refers to the bases; once the delta goes, they go with it."""
    blobs = BlobStore(store / "blobs")
    bodies = [
        b'{"messages": [' + b", ".join(b'{"n": %d, "text": "%s"}' % (i, b"x" * 40) for i in range(n)) + b"]}"
        for n in (30, 31, 32)
    ]
    refs: list[BlobRef] = []
    for body in bodies:
        refs.append(blobs.put(body, "application/json", base=refs[-1] if refs else None))
    entries = [blobs.entry(r.blob[7:]) for r in refs[1:]]
    assert [e.codec if e else None for e in entries] == [ord("d"), ord("d")]
    with Store.open(store) as st:
        st.con.execute("CREATE TABLE side (note VARCHAR)")
        st.con.execute("INSERT INTO side VALUES (?)", [f"kept: {refs[2].blob}"])
    blobs.close()
    done = collect(blobs, store / "spool", lambda: Store.open(store, read_only=True).con)
    assert done.problems == []
    assert blobs.get(refs[2]) == bodies[2] and blobs.check(refs[0].blob) is None
    with Store.open(store) as st:
        st.con.execute("DELETE FROM side")
    blobs.close()
    done = collect(blobs, store / "spool", lambda: Store.open(store, read_only=True).con)
    assert done.removed == 3 and all("missing" in (blobs.check(r.blob) or "") for r in refs)
    assert problems(store) == []


def test_gc_leaves_a_pack_cut_short_as_it_is_and_names_it(store):
    """A pack cut short (a copy that stopped, a disk that lost its end) holds damaged copies of live
    blobs its index still lists: gc neither rewrites it (which dropped those entries, turning
    `corrupted` into `missing`) nor says all went well."""
    blobs = BlobStore(store / "blobs")
    blobs.close()
    pack = max(blobs.pack_files(), key=lambda p: p.stat().st_size)  # (each run's writer sealed its own)
    with open(pack, "r+b") as f:
        f.truncate(pack.stat().st_size // 2)
    idx = pack.with_suffix(".idx")
    before = {p: p.read_bytes() for p in (pack, idx)}
    found = problems(store)
    assert found and all("is corrupted" in p for p in found), found
    done = amb("gc", "--blobs", "--store", str(store))
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"amb: error: {pack.name} left as it is: blob sha256:") and "is corrupted" in line
    assert {p: p.read_bytes() for p in before} == before
    assert problems(store) == found


def test_gc_keeps_the_blobs_of_runs_whose_compressed_spools_wait_for_ingest(store):
    """A damaged database moved aside and rebuilt one run at a time: the other runs' spools, which
    ingest compressed, wait with their events in no database yet. gc reads their references
    through the compression, so their blobs stay, and the store verifies once they are in."""
    spools = sorted((store / "spool").glob("*/*.spool.zst"))
    assert spools, "the store's ingest compressed its spools"
    (store / "amb.duckdb").rename(store / "damaged.duckdb")
    runs = sorted(p.name for p in (store / "spool").iterdir())
    ingest(store, run_ids=runs[:1])
    done = amb("gc", "--blobs", "--store", str(store), "--json")
    assert done.returncode == 0, done.stderr
    assert ingest(store).runs == runs[1:]
    assert problems(store) == []
    (spools[-1]).write_bytes(b"not zstd at all")  # a spool gc cannot read: it removes nothing
    refused = amb("gc", "--blobs", "--store", str(store))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.startswith(f"amb: error: {spools[-1]}: cannot decompress"), refused.stderr
    assert "gc removes nothing" in refused.stderr


def test_gc_and_every_reader_name_a_database_without_its_events_table(store):
    """A database file whose events table is gone (damaged, or made by hand): one line naming it
    as damaged, never a traceback, and gc removes nothing."""
    import duckdb

    con = duckdb.connect(str(store / "amb.duckdb"))
    con.execute("DROP TABLE events CASCADE")
    con.close()
    before = sorted(p.name for p in (store / "blobs" / "packs").iterdir())
    done = amb("gc", "--blobs", "--store", str(store))
    assert done.returncode == 1 and done.stderr.startswith("amb: error: the store's database has no events")
    assert sorted(p.name for p in (store / "blobs" / "packs").iterdir()) == before
    for args in (("runs",), ("verify",), ("files", "x"), ("export", "otel", "x")):
        r = amb(*args, "--store", str(store))
        assert r.returncode != 0 and "Traceback" not in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("amb: error: the store's amb.duckdb is damaged (Catalog Error: Table with")
