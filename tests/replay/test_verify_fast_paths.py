"""amb verify's fast paths find exactly what the plain checks find.

- The hash check runs in batches of row ids: DuckDB builds a batch's canonical bodies while the
  batch before is hashed in Python. Compared here with the whole check done in one SQL query
  (DuckDB's own ``sha256`` and a window over every chain: the check as it was before), after each
  kind of tampering, in batches small enough that every tamper lands inside some later batch.
- The chains are checked without sorting (counts and an anti-join); the window that words the
  problems runs over the unsound chains only. The same comparison covers it.
- The blob pass runs in a child process for big stores: the same problems as in a thread.
- One scan of the payloads per batch also re-derives the hot columns and reads the blob
  references and their count (the manifests' ``blob_refs``): compared with the queries that did
  each apart, with tampers in the first, middle and last batch.
- The blob pass starts before the references are known (it judges them at the end): a record
  damaged at the start, the middle or the end of a pack is named, in the child and in a thread.

Every tamper is made inside an open transaction of the connection that verifies (so rows it
inserts get row ids from 2^62 and nothing is committed): the checks must see what it sees.
"""

from __future__ import annotations

import os
import shutil
import zlib

import pytest

from replay import hot
from replay import manifest as manifests
from replay.store import Store
from replay.verify import BODY_SQL, _scan, check_events, verify
from schemas import packstore
from schemas.blob import HASH_PREFIX
from schemas.codec import GENESIS
from tests.fakes.blob_tamper import remove_blob, replace_blob

REFERENCE = f"""
    WITH e AS (
        SELECT run_id, source, seq, kind, hash, prev_hash,
               'sha256:' || sha256({BODY_SQL}) AS rehash,
               lag(hash) OVER w AS prev_stored,
               row_number() OVER w - 1 AS expected_seq
        FROM events
        WINDOW w AS (PARTITION BY run_id, source ORDER BY seq, hash)
    )
    SELECT run_id, source, seq, kind,
           CASE
             WHEN seq <> expected_seq THEN 'sequence gap: seq ' || expected_seq || ' is missing'
             WHEN rehash <> hash THEN 'hash mismatch: the event was edited after it was recorded'
             ELSE 'broken chain: prev_hash is not the hash of the event before it'
           END AS what
    FROM e
    WHERE seq <> expected_seq OR rehash <> hash OR prev_hash <> coalesce(prev_stored, '{GENESIS}')
    ORDER BY run_id, source, seq
"""
"""The events check in one query, hashes by DuckDB's sha256: the independent implementation."""

AT = "WHERE run_id = 'run-1' AND source = 'shim' AND seq = {}"
LAST = "(SELECT max(seq) FROM events WHERE run_id = 'run-2' AND source = 'proxy')"

TAMPERS = {
    "payload byte": [
        "UPDATE events SET payload = replace(CAST(payload AS VARCHAR), '\"', ' \"') " + AT.format(4)
    ],
    "envelope field": ["UPDATE events SET ts_ns = ts_ns + 1 " + AT.format(7)],
    "stored hash": ["UPDATE events SET hash = 'sha256:' || repeat('0', 64) " + AT.format(9)],
    "hash without its prefix": ["UPDATE events SET hash = substr(hash, 8) " + AT.format(9)],
    "deleted event": ["DELETE FROM events " + AT.format(5)],
    "deleted first event": ["DELETE FROM events " + AT.format(0)],
    "deleted last event": [
        f"DELETE FROM events WHERE run_id = 'run-2' AND source = 'proxy' AND seq = {LAST}"
    ],
    "reordered": [
        "UPDATE events SET seq = -1 " + AT.format(2),
        "UPDATE events SET seq = 2 " + AT.format(3),
        "UPDATE events SET seq = 3 " + AT.format(-1),
    ],
    "seq twice": ["UPDATE events SET seq = 5 " + AT.format(6)],
    "rehashed edit": [
        "UPDATE events SET ts_ns = ts_ns - 1000 " + AT.format(4),
        f"UPDATE events SET hash = 'sha256:' || sha256({BODY_SQL}) " + AT.format(4),
    ],
    "rehashed first event off genesis": [
        "UPDATE events SET prev_hash = 'sha256:' || repeat('1', 64) " + AT.format(0),
        f"UPDATE events SET hash = 'sha256:' || sha256({BODY_SQL}) " + AT.format(0),
    ],
    "inserted copy": [
        f"INSERT INTO events SELECT * REPLACE (seq + 1 AS seq) FROM events "
        f"WHERE run_id = 'run-2' AND source = 'proxy' AND seq = {LAST}"
    ],
    "inserted copy far ahead": [
        "INSERT INTO events SELECT * REPLACE (seq + 1000 AS seq) FROM events " + AT.format(1)
    ],
    "every event of a run": ["UPDATE events SET ts_ns = ts_ns + 1 WHERE run_id = 'run-0'"],
}


def test_events_check_finds_what_the_one_query_finds(store):
    """Each tamper in turn (rolled back after), hashed in batches of 5 events."""
    with Store.open(store) as st:
        assert st.con.execute(REFERENCE).fetchall() == [] and check_events(st.con, batch=5) == []
        for tamper, statements in TAMPERS.items():
            st.con.execute("BEGIN")
            for statement in statements:
                st.con.execute(statement)
            expected = st.con.execute(REFERENCE).fetchall()
            found = check_events(st.con, batch=5)
            st.con.execute("ROLLBACK")
            # A deleted last event leaves a sound, shorter chain: only the manifests see it.
            assert expected or tamper == "deleted last event", f"{tamper}: not seen by the reference"
            assert [tuple(p) for p in found] == expected, tamper


def test_a_tampered_event_in_any_batch_is_found(store):
    """One event edited at the start, the middle and the end of the table, hashed in batches of
    7: each is found, and nothing else."""
    with Store.open(store) as st:
        rowids = [r[0] for r in st.con.execute("SELECT rowid FROM events ORDER BY rowid").fetchall()]
        assert len(rowids) > 20 * 7
        for rowid in (rowids[0], rowids[len(rowids) // 2], rowids[-1], rowids[7 * 13 + 6]):
            st.con.execute("BEGIN")
            key = st.con.execute("SELECT run_id, source, seq FROM events WHERE rowid = ?", [rowid]).fetchall()
            st.con.execute("UPDATE events SET ts_ns = ts_ns + 1 WHERE rowid = ?", [rowid])
            found = check_events(st.con, batch=7)
            st.con.execute("ROLLBACK")
            assert [(p.run_id, p.source, p.seq) for p in found] == key
            assert found[0].what == "hash mismatch: the event was edited after it was recorded"


def test_events_check_of_named_runs_in_batches(store):
    with Store.open(store) as st:
        st.con.execute("BEGIN")
        st.con.execute("UPDATE events SET ts_ns = 0 WHERE run_id = 'run-2' AND seq = 1")
        st.con.execute("DELETE FROM events WHERE run_id = 'run-0' AND source = 'shim' AND seq = 3")
        assert check_events(st.con, ["run-1"], batch=5) == []
        only_2 = check_events(st.con, ["run-2"], batch=5)
        both = check_events(st.con, ["run-0", "run-2"], batch=5)
        st.con.execute("ROLLBACK")
    assert only_2 and {p.run_id for p in only_2} == {"run-2"}
    assert {p.run_id for p in both} == {"run-0", "run-2"}
    assert [p for p in both if p.run_id == "run-2"] == only_2


def test_blob_pass_in_a_child_process_finds_what_the_thread_finds(store):
    with Store.open(store, read_only=True) as st:
        missing, corrupted = (
            r[0]
            for r in st.con.execute(
                "SELECT response_blob FROM model_calls WHERE run_id = 'run-1' ORDER BY seq LIMIT 2"
            ).fetchall()
        )
        remove_blob(st.blobs, missing)
        replace_blob(st.blobs, corrupted, zlib.compress(b'{"tampered": true}'))
    with Store.open(store, read_only=True) as st:
        seen: list[tuple[int, int]] = []
        apart = verify(st.con, st.blobs, progress=lambda d, t: seen.append((d, t)), blob_process=True)
        here = verify(st.con, st.blobs, blob_process=False)
    assert apart == here
    assert any(missing in p.what and "missing" in p.what for p in apart)
    assert any(corrupted in p.what and "does not match its address" in p.what for p in apart)
    assert seen and seen[-1][0] == seen[-1][1]  # the child's progress reached this process


def test_clean_store_passes_with_the_blob_pass_apart(store):
    with Store.open(store, read_only=True) as st:
        assert verify(st.con, st.blobs, blob_process=True) == []


HOT_REFERENCE = (
    "SELECT * FROM (SELECT run_id, source, seq, kind, CASE {} END AS what FROM events) WHERE what IS NOT NULL"
)
"""The hot-column check as one query, a JSON extraction per column (the check as it was)."""


def _hot_reference(con) -> list[tuple]:
    whens = " ".join(
        f"WHEN {c.name} IS DISTINCT FROM {hot.from_payload(c)} "
        f"THEN 'hot column {c.name} differs from the payload (edited after ingest)'"
        for c in hot.HOT_COLUMNS
    )
    return con.execute(HOT_REFERENCE.format(whens) + " ORDER BY 1, 2, 3").fetchall()


def _spread(con, batch: int) -> list[int]:
    """Row ids at the start, the middle and the end of the table, and the last of an inner batch."""
    rowids = [r[0] for r in con.execute("SELECT rowid FROM events ORDER BY rowid").fetchall()]
    assert len(rowids) > 20 * batch
    return [rowids[0], rowids[len(rowids) // 2], rowids[-1], rowids[batch * 13 + batch - 1]]


def test_a_hot_column_edited_in_any_batch_is_found(store):
    """A hot column edited (one the payload has, one it has not) at the start, the middle and the
    end of the table: the scan names each as the one-query check does, and nothing else."""
    with Store.open(store) as st:
        assert _hot_reference(st.con) == []
        for rowid in _spread(st.con, 7):
            for edit in ("tool_name = 'edited'", "exit_code = coalesce(exit_code, 0) + 1"):
                st.con.execute("BEGIN")
                st.con.execute(f"UPDATE events SET {edit} WHERE rowid = ?", [rowid])
                expected = _hot_reference(st.con)
                found = check_events(st.con, batch=7)
                st.con.execute("ROLLBACK")
                assert len(expected) == 1, (rowid, edit)
                assert [tuple(p) for p in found] == expected, (rowid, edit)


def _refs_reference(con) -> list[tuple]:
    """Every referenced blob with the first event (by run, source, seq) that refers to it."""
    return con.execute(
        f"""
        SELECT b, run_id, source, seq, kind
        FROM (SELECT run_id, source, seq, kind, unnest({manifests.BLOB_REF_SQL}) AS b FROM events)
        QUALIFY row_number() OVER (PARTITION BY b ORDER BY run_id, source, seq) = 1
        ORDER BY run_id, source, seq, b
        """
    ).fetchall()


ADD_REFERENCE = (
    "UPDATE events SET payload = json_merge_patch(payload, json_object('x', json_object('blob', ?)))"
    " WHERE rowid = ?"
)


def _scanned_manifests(con, batch: int) -> tuple[set[str], dict]:
    scanned = _scan(con, None, batch)
    return set(scanned.addresses), scanned.current


def test_blob_references_and_manifests_from_the_scan(store):
    """The references and the manifests the scan yields are the ones the separate queries give
    (``manifest.compute_many``), on the store as written and after a reference is added to a
    payload in the first, middle and last batch."""
    with Store.open(store) as st:
        runs = [r[0] for r in st.con.execute("SELECT DISTINCT run_id FROM events ORDER BY 1").fetchall()]
        refs, current = _scanned_manifests(st.con, 5)
        assert refs == {r[0] for r in _refs_reference(st.con)} and len(refs) > 10
        assert current == manifests.compute_many(st.con, runs)
        extra = HASH_PREFIX + "ab" * 32
        for rowid in _spread(st.con, 5):
            st.con.execute("BEGIN")
            st.con.execute(ADD_REFERENCE, [extra, rowid])
            refs, current = _scanned_manifests(st.con, 5)
            expected_refs, expected = _refs_reference(st.con), manifests.compute_many(st.con, runs)
            st.con.execute("ROLLBACK")
            assert extra in refs
            assert refs == {r[0] for r in expected_refs} and current == expected, rowid


@pytest.mark.parametrize("store", ["packed"], indirect=True)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_damaged_pack_record_anywhere_is_named(store, tmp_path, where):
    """One byte of a referenced blob's record flipped (the first, middle or last record of a pack):
    the blob pass started before the references are known names it, in a child process as in a
    thread, with the words an ordinary read of that blob gives."""
    with Store.open(store, read_only=True) as st:
        referenced = {r[0][len(HASH_PREFIX) :] for r in _refs_reference(st.con)}
        pack = max(st.blobs.pack_files(), key=lambda p: p.stat().st_size)
    records = [r for r in packstore.scan(pack) if r.hexd in referenced]
    assert len(records) > 10
    record = {"first": records[0], "middle": records[len(records) // 2], "last": records[-1]}[where]
    os.chmod(pack, 0o644)
    with open(pack, "r+b") as f:
        at = record.offset + record.length - 1  # the last byte of the stored content
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    address = HASH_PREFIX + record.hexd
    with Store.open(store, read_only=True) as st:
        apart = verify(st.con, st.blobs, blob_process=True)
        here = verify(st.con, st.blobs, blob_process=False)
        words = st.blobs.check(address)
    assert apart == here
    named = [p for p in apart if p.what.startswith(f"blob {address} ")]  # (deltas built on it name it too)
    assert named and words and all(p.what == words for p in named), (apart, words)
    shutil.rmtree(tmp_path / "store", ignore_errors=True)


def test_rehash_reads_a_body_column_of_several_chunks_and_slices():
    """DuckDB hands a batch's bodies as several Arrow chunks (and a chunk may be a slice of a
    bigger array, with an offset): each chunk is hashed where it lies. Every position whose stored
    hash differs is found, in whichever chunk, and only those."""
    import hashlib

    import pyarrow as pa

    from replay.verify import _rehash_failures

    bodies = [f'{{"kind":"note","n":{i},"text":"{"x" * i}"}}' for i in range(12)]
    hexes = [hashlib.sha256(b.encode()).hexdigest() for b in bodies]
    hexes[5] = "0" * 64  # in the sliced chunk
    hexes[10] = "!" + hexes[10]  # a stored hash without its prefix, in the last chunk
    whole = pa.array(bodies)
    column = pa.chunked_array([whole[:3], whole[3:3], whole[3:8], pa.array(bodies[8:])])
    assert column.num_chunks == 4 and column.chunk(2).offset == 3
    table = pa.table({"body": column, "hex": pa.chunked_array([pa.array(hexes[:7]), pa.array(hexes[7:])])})
    assert _rehash_failures(table) == [5, 10]
    assert _rehash_failures(table.slice(0, 5)) == []
