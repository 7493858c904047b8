"""The blob pass of ``amb verify`` with its bookkeeping in arrays (``replay.blob_reads``) judges
every blob as the blob store's own index does (``schemas.blobverify.verify_many``) and as an
ordinary read of it does: hostile index entries, damaged records, an address stored twice (the
copy reads use is the one judged), a conversation's shared chunk damaged where reads find it. And
``amb verify`` of a whole store keeps the database's memory small and its blob references on disk,
and still names every problem: in the first and the last chunk, in a chunk that needs more memory
than the limit it starts with."""

from __future__ import annotations

import hashlib
import json
import random
import sys

import numpy as np
import pytest
import zstandard

from replay import blob_pass, bounded
from replay import verify as verify_mod
from replay.blob_pass import BlobPass
from replay.blob_reads import ArrayReads, _by_digest, split
from replay.bounded import memory_limit
from replay.store import Store
from replay.verify import verify
from schemas import blobcodec, blobverify, packstore
from schemas.blob import HASH_PREFIX
from schemas.blobstore import BlobStore
from schemas.blobverify import verify_many
from tests.fakes.blob_tamper import remove_blob, replace_blob, set_entry
from tests.schemas import test_packstore
from tests.schemas.test_blob_delta import conversation


def judged(store: BlobStore, addresses: list[str]) -> dict[str, str]:
    """The problems the array pass finds, in a thread, in a child process, and in pieces shared by
    two children and this process (the same), checked against the dict pass and the words of an
    ordinary read of each."""
    store.forget()
    here = BlobPass(store, apart=False).result(addresses)
    apart = BlobPass(store, apart=True).result(addresses)
    shared = BlobPass(store, apart=True, children=2, piece=_piece(store)).result(addresses)
    assert here == apart == shared == verify_many(store, addresses)
    assert here == {a: r for a in addresses if (r := store.check(a))}
    return here


def _piece(store: BlobStore) -> int:
    """A piece size that cuts the store's packs into about a dozen pieces."""
    return max(sum(p.stat().st_size for p in store.pack_files()) // 12, 1)


def _lying_length(store: BlobStore, blob: str) -> None:
    e = store.entry(blob[7:])
    assert e is not None
    set_entry(store, blob, e.offset, e.length - 1)


def _another_record(store: BlobStore, blob: str) -> None:
    other = store.entry(next(a for a in store.addresses() if a != blob[7:]))
    assert other is not None
    set_entry(store, blob, other.offset, other.length)


def _wrong_codec(store: BlobStore, blob: str) -> None:
    e = store.entry(blob[7:])
    assert e is not None
    set_entry(store, blob, e.offset, e.length, codec=ord("s") if e.codec != ord("s") else ord("z"))


packed = test_packstore.packed  # (the fixture: 50 small blobs in one pack)

ZSTD = zstandard.ZstdCompressor()
TAMPERS = {
    "outside the pack": lambda s, b: set_entry(s, b, s.pack_files()[0].stat().st_size + 10, 50),
    "lying length": _lying_length,
    "another record": _another_record,
    "wrong codec": _wrong_codec,
    "other content": lambda s, b: replace_blob(
        s, b, zstandard.ZstdCompressor().compress(b"x"), blobcodec.ZSTD
    ),
    "removed": remove_blob,
}


@pytest.mark.parametrize("tamper", TAMPERS)
def test_a_hostile_index_or_record_is_judged_as_a_read_judges_it(packed, tamper):
    store, refs, _ = packed
    blobs = [r.blob for r in refs]
    assert judged(store, blobs) == {}
    TAMPERS[tamper](store, blobs[7])
    assert set(judged(store, blobs)) == {blobs[7]}


def test_an_address_stored_twice_is_judged_by_the_copy_reads_use(tmp_path):
    """The same blob in two packs: the later pack's entry is the one reads use. Its record damaged,
    the sound earlier copy does not vouch for it; the earlier copy damaged, nothing is wrong."""
    store = BlobStore(tmp_path)
    first = store.put(b"the same content, twice" * 50)
    others = [store.put(b"other %d" % i) for i in range(5)]
    store.close()
    writer = packstore.PackWriter(store.packs_dir)  # a second copy, in a pack of its own
    writer.append(first.blob[7:], *store.stored_record(first.blob[7:]), sync=True)
    writer.close()
    store.forget()
    packs = store.pack_files()
    assert len(packs) == 2
    blobs = [first.blob] + [r.blob for r in others]
    assert judged(store, blobs) == {}
    copies = {p: next(r for r in packstore.scan(p) if r.hexd == first.blob[7:]) for p in packs}
    later = max(packs)
    entry = store.entry(first.blob[7:])
    assert entry is not None and entry.pack + packstore.PACK_SUFFIX == later.name
    for pack, damaged in ((min(packs), {}), (later, {first.blob})):
        rec = copies[pack]
        original = pack.read_bytes()
        pack.chmod(0o644)
        with open(pack, "r+b") as f:
            f.seek(rec.offset + rec.length - 1)
            f.write(bytes([original[rec.offset + rec.length - 1] ^ 1]))
        assert set(judged(store, blobs)) == set(damaged), pack
        pack.write_bytes(original)


def test_a_conversation_whose_shared_chunk_is_damaged_where_reads_find_it(tmp_path):
    """Requests resending the conversation so far share their leading chunk. Damaged where reads
    find it (a sound copy stays earlier in the pack), every list fails, as a read of it does."""
    store = BlobStore(tmp_path)
    rng = random.Random(1)
    turns = [json.dumps({"role": "user", "content": rng.randbytes(3000).hex()}) for _ in range(30)]
    refs = [store.put(("[" + ",\n".join(turns[:k]) + "]").encode()) for k in range(12, 31)]
    store.close()
    blobs = [r.blob for r in refs]
    assert judged(store, blobs) == {}
    shared = {bytes(store.stored_record(b[7:])[1]).split(b"\n")[1] for b in blobs}
    assert len(shared) == 1
    replace_blob(store, shared.pop().decode(), zstandard.ZstdCompressor().compress(b"other"), blobcodec.ZSTD)
    assert set(judged(store, blobs)) == set(blobs)


DELTA_EDITS = {
    "at its start": lambda content, base: b"X" + content[1:],
    "in its head": lambda content, base: content[:100] + b"X" + content[101:],
    "in its tail": lambda content, base: content[:-2] + b"X" + content[-1:],
    "cut to its base's head": lambda content, base: base[: len(base) - blobverify.HASH_TAIL],
    "one byte longer": lambda content, base: content + b" ",
}


@pytest.mark.parametrize("edit", DELTA_EDITS)
def test_a_delta_whose_content_is_not_its_address_fails_however_it_starts(tmp_path, edit):
    """The pass hashes a delta on from its base's head state when its content starts with the
    base's head (``blobverify.HASH_TAIL``): a delta record whose content is edited anywhere (in
    the part that shortcut skips, or so that it no longer applies) still fails, as a read of it
    does, and the requests before it pass."""
    store = BlobStore(tmp_path)
    ref = None
    refs = []
    for body in conversation(12):
        ref = store.put(body, "application/json", sync=False, base=ref)
        refs.append(ref)
    store.close()
    blobs = [r.blob for r in refs]
    assert judged(store, blobs) == {}
    victim = blobs[6]
    entry = store.entry(victim[7:])
    assert entry is not None and entry.codec == blobcodec.DELTA
    base_hex = blobcodec.delta_base(store.stored_record(victim[7:])[1], victim)
    base = store.get(HASH_PREFIX + base_hex)
    edited = DELTA_EDITS[edit](store.get(victim), base)
    assert hashlib.sha256(edited).hexdigest() != victim[7:]
    frame = zstandard.ZstdCompressor(
        dict_data=zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT),
        write_content_size=True,
    ).compress(edited)
    replace_blob(store, victim, blobcodec.DELTA_MAGIC + bytes.fromhex(base_hex) + frame, blobcodec.DELTA)
    bad = set(judged(store, blobs))  # (the deltas built on it fail with it, as their reads do)
    assert victim in bad and not bad & set(blobs[:6])


def test_addresses_that_are_not_addresses_are_read_the_ordinary_way(packed):
    """What the child is handed is judged whatever it is: a malformed line is named, not a crash."""
    store, refs, _ = packed
    blobs = [r.blob for r in refs]
    reads = ArrayReads(store)
    assert list(reads.unvouched(["sha256:xyz", blobs[0]])) == ["sha256:xyz", blobs[0]]
    found = BlobPass(store, apart=True).result([blobs[0], "sha256:" + "0" * 64])
    assert list(found) == ["sha256:" + "0" * 64]


def test_the_child_pass_runs_amb_s_own_code_whatever_the_working_directory(packed, tmp_path, monkeypatch):
    """The child pass is amb's ``replay.blob_pass``, not a module of the same name in the folder
    ``amb verify`` runs from (``python -m`` puts that folder first on the import path): a folder
    holding a ``replay`` package whose pass vouches for every blob leaves a damaged blob named."""
    store, refs, _ = packed
    blobs = [r.blob for r in refs]
    fake = tmp_path / "cwd" / "replay"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "blob_pass.py").write_text("print('{\"problems\": {}}')\n")
    replace_blob(store, blobs[3], ZSTD.compress(b"other"), blobcodec.ZSTD)
    monkeypatch.chdir(fake.parent)
    found = BlobPass(store, apart=True).result(blobs)
    assert list(found) == [blobs[3]]


def _first_and_last_runs_blobs(con) -> list[str]:
    """The last response of the first run and of the last run."""
    return [
        con.execute(
            "SELECT response_blob FROM model_calls WHERE run_id = ? AND response_blob IS NOT NULL "
            "ORDER BY seq DESC LIMIT 1",
            [run],
        ).fetchone()[0]
        for run in ("run-0", "run-2")
    ]


@pytest.mark.parametrize("store", ["packed"], indirect=True)
def test_missing_blobs_of_the_first_and_last_chunk_are_named(store):
    """A chunk per run: a blob of the first run and one of the last run are removed; both are
    named, at the run that refers to them, in a thread and apart, as the scan in one chunk names
    them (the references of every chunk went through the file they are kept in)."""
    with Store.open(store, read_only=True) as st:
        gone = _first_and_last_runs_blobs(st.con)
        for blob in gone:
            remove_blob(st.blobs, blob)
    with Store.open(store, read_only=True) as st:
        here = verify(st.con, st.blobs, blob_process=False, batch=1)
        apart = verify(st.con, st.blobs, blob_process=True, batch=1)
        whole = verify(st.con, st.blobs, blob_process=False)
    assert here == apart == whole
    for run, blob in zip(("run-0", "run-2"), gone, strict=True):
        assert [p.run_id for p in here if p.what.startswith(f"blob {blob} ") and "missing" in p.what] == [run]


@pytest.mark.parametrize("store", ["packed"], indirect=True)
def test_a_chunk_that_needs_more_memory_is_fetched_again_with_more(store, monkeypatch, memory_growth):
    """The scan of a whole store starts with a database memory limit too small for a chunk: the
    chunk is fetched again with twice the limit until it fits, a tampered event is still found,
    and the limit is DuckDB's default again afterwards."""
    monkeypatch.setattr(bounded, "DATABASE_MEMORY", 1 << 16)
    with Store.open(store) as st:
        default = memory_limit(st.con)
        st.con.execute(
            "UPDATE events SET ts_ns = ts_ns + 1 WHERE run_id = 'run-2' AND seq = 3 AND source = 'shim'"
        )
        problems = verify(st.con, st.blobs)
        assert memory_limit(st.con) == default
    assert memory_growth, "the first limit was enough: the test did not reach the retry"
    assert [(p.run_id, p.seq, p.what) for p in problems] == [("run-2", 3, verify_mod.HASH_MISMATCH)]


def test_references_read_back_as_written():
    refs = bounded.References()
    blobs = [HASH_PREFIX + hashlib.sha256(b"%d" % i).hexdigest() for i in range(70_000)]
    refs.update(blobs[:3])
    refs.update([])
    refs.update(blobs[3:])
    assert list(refs) == blobs
    assert list(refs) == blobs  # again, from the start
    refs.close()


def test_the_pass_does_not_read_the_index_into_a_dict(packed):
    """The blob store's index as a dict costs several hundred bytes a blob (a gigabyte for a year
    of sweeps): the pass of a sound store never reads it (only a blob that fails is read the
    ordinary way, through it)."""
    store, refs, _ = packed
    blobs = [r.blob for r in refs]
    store.forget()
    assert BlobPass(store, apart=False).result(blobs) == {}
    assert len(store._state.index) == 0


def test_pieces_are_cut_where_records_start_and_cover_every_pack_once(tmp_path):
    """Three packs cut into pieces: every piece starts where a record starts (or at a pack's
    start), the pieces follow one another without a gap or an overlap, and every record is in
    exactly one piece."""
    store = BlobStore(tmp_path)
    for k in range(3):
        for i in range(40):
            store.put(b"pack %d blob %d " % (k, i) * (i + 1))
        store.close()  # (the next puts go to a new pack)
    packs = store.pack_files()
    assert len(packs) == 3
    records = {(p.name, r.offset) for p in packs for r in packstore.scan(p)}
    for parts in (1, 2, 5, 17, 200):
        pieces = split(store, parts)
        assert len(pieces) == parts
        seen = [
            (p.name, r.offset)
            for piece in pieces
            for name, start, stop in piece
            for p in [store.packs_dir / name]
            for r in packstore.scan(p, start=start, stop=stop)
        ]
        assert sorted(seen) == sorted(records), parts
        starts = {(name, start) for piece in pieces for name, start, _ in piece if start}
        assert starts <= records


def _with_pieces(count: int):
    """``BlobPass.__init__`` with pieces of the size that cuts the store into ``count``."""
    original = BlobPass.__init__

    def init(self, blobs, progress=None, apart=False, children=1, piece=blob_pass.PIECE):
        size = sum(p.stat().st_size for p in blobs.pack_files())
        original(self, blobs, progress, apart, children, -(-size // count) if apart else piece)

    return init


def test_a_cut_at_an_index_offset_inside_a_record_costs_time_not_soundness(packed, monkeypatch):
    """A damaged index can give an offset where no record starts, and a cut can land there: the
    piece that starts there fails at once, its blobs are read the ordinary way, and every blob is
    judged as a read judges it (sound ones pass, a damaged one is named)."""
    store, refs, _ = packed
    blobs = [r.blob for r in refs]
    pack = store.pack_files()[0]
    middle = next(r for r in packstore.scan(pack) if r.hexd == blobs[20][7:])
    inside = middle.offset + middle.length // 2
    with open(pack.with_suffix(packstore.IDX_SUFFIX), "ab") as idx:
        idx.write(packstore.ENTRY.pack(b"\x01" * 32, inside, 10, ord("r")))
    store.forget()
    cut_there = [
        n for n in range(2, 200) if any(start == inside for piece in split(store, n) for _, start, _ in piece)
    ]
    assert cut_there, "no number of pieces cuts at the damaged offset"
    monkeypatch.setattr(BlobPass, "__init__", _with_pieces(cut_there[0]))
    assert judged(store, blobs) == {}
    replace_blob(store, blobs[30], ZSTD.compress(b"other"), blobcodec.ZSTD)
    assert set(judged(store, blobs)) == {blobs[30]}


def test_digests_that_share_their_first_bytes_are_ordered_whole():
    """The index is ordered by the digests' first eight bytes unless two share them: then by the
    whole digests, as a search by whole digests needs."""
    rng = random.Random(7)
    head = rng.randbytes(8)
    digests = [head + rng.randbytes(24) for _ in range(50)] + [rng.randbytes(32) for _ in range(50)]
    rng.shuffle(digests)
    array = np.frombuffer(b"".join(digests), "V32")
    order, _ = _by_digest(array)
    assert len({d[:8] for d in digests}) == 51
    assert [bytes(d) for d in array[order]] == sorted(digests)


def test_a_child_that_sends_no_sound_answer_leaves_the_judging_to_this_process(packed, tmp_path, monkeypatch):
    """A child that dies mid-pass (its interpreter replaced by one that exits at once): the pass
    is run again here, and a damaged blob is still named."""
    store, refs, _ = packed
    blobs = [r.blob for r in refs]
    replace_blob(store, blobs[5], ZSTD.compress(b"other"), blobcodec.ZSTD)
    dying = tmp_path / "python"
    dying.write_text("#!/bin/sh\nexit 3\n")
    dying.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(dying))
    assert list(BlobPass(store, apart=True, children=2, piece=_piece(store)).result(blobs)) == [blobs[5]]
