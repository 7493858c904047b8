"""amb verify catches each kind of tampering, in the DuckDB file and in the blob directory."""

from __future__ import annotations

import hashlib
import json
import zlib

import pytest
from click.testing import CliRunner

from amb.main import cli
from recorder.synthetic import generate_run
from replay import manifest as manifests
from replay.ingest import ingest
from replay.store import Store
from replay.verify import verify
from schemas.codec import decode_body
from schemas.errors import AmbError
from schemas.frames import MAGIC, encode_frame, scan
from tests.fakes.blob_tamper import remove_blob, replace_blob


def problems(root, **kw):
    with Store.open(root, read_only=True) as st:
        return verify(st.con, st.blobs, **kw)


def tamper(root, *statements):
    with Store.open(root) as st:
        for s in statements:
            st.con.execute(s)


def test_clean_store_verifies(store):
    assert problems(store) == []


def test_edited_payload_byte(store):
    tamper(
        store,
        "UPDATE events SET payload = replace(CAST(payload AS VARCHAR), 'execute_code', 'execute_cod3') "
        "WHERE run_id = 'run-1' AND source = 'proxy' AND seq = 1",
    )
    found = problems(store)
    assert (found[0].run_id, found[0].source, found[0].seq) == ("run-1", "proxy", 1)
    assert "hash mismatch" in found[0].what


def test_edited_envelope_field(store):
    tamper(
        store, "UPDATE events SET ts_ns = ts_ns + 1 WHERE run_id = 'run-0' AND source = 'shim' AND seq = 3"
    )
    assert [(p.seq, "hash mismatch" in p.what) for p in problems(store)] == [(3, True)]


def test_deleted_event_is_a_gap(store):
    tamper(store, "DELETE FROM events WHERE run_id = 'run-2' AND source = 'proxy' AND seq = 5")
    first = problems(store)[0]
    assert (first.run_id, first.source, first.seq) == ("run-2", "proxy", 6)
    assert first.what == "sequence gap: seq 5 is missing"


def test_deleted_last_event_breaks_the_manifest(store):
    tamper(
        store,
        (
            "DELETE FROM events WHERE run_id = 'run-0' AND source = 'recorder' AND seq = (SELECT max(seq) "
            "FROM events WHERE run_id = 'run-0' AND source = 'recorder')"
        ),
    )
    found = problems(store)
    assert (
        found and found[0].run_id == "run-0" and "manifest" in found[0].what and "recorder" in found[0].what
    )


def test_reordered_events(store):
    tamper(
        store,
        "UPDATE events SET seq = -1 WHERE run_id = 'run-1' AND source = 'shim' AND seq = 2",
        "UPDATE events SET seq = 2 WHERE run_id = 'run-1' AND source = 'shim' AND seq = 3",
        "UPDATE events SET seq = 3 WHERE run_id = 'run-1' AND source = 'shim' AND seq = -1",
    )
    found = problems(store)
    assert (found[0].run_id, found[0].source, found[0].seq) == ("run-1", "shim", 2)


def test_rehashed_edit_breaks_the_next_link(store):
    """An editor who also fixes the edited event's hash is caught by the next event's prev_hash."""
    from replay.verify import BODY_SQL

    tamper(
        store,
        "UPDATE events SET ts_ns = ts_ns - 1000 WHERE run_id = 'run-0' AND source = 'proxy' AND seq = 4",
        (
            f"UPDATE events SET hash = 'sha256:' || sha256({BODY_SQL}) WHERE run_id = 'run-0' AND source = "
            "'proxy' AND seq = 4"
        ),
    )
    found = problems(store)
    assert (found[0].seq, found[0].what) == (
        5,
        "broken chain: prev_hash is not the hash of the event before it",
    )


def test_rebuilt_chain_is_caught_by_an_anchored_manifest(store):
    """Whoever can write the file can rebuild the whole chain; only a manifest kept elsewhere shows it."""
    from replay.verify import BODY_SQL

    with Store.open(store, read_only=True) as st:
        anchored = manifests.stored(st.con, "run-0")
    tamper(
        store,
        "DELETE FROM manifests WHERE run_id = 'run-0'",
        (
            "DELETE FROM events WHERE run_id = 'run-0' AND source = 'proxy' AND seq = (SELECT max(seq) "
            "FROM events WHERE run_id = 'run-0' AND source = 'proxy')"
        ),
    )
    # The recorder's count of what the proxy wrote still says one is missing...
    assert [(p.source, p.what.split(":")[0]) for p in problems(store)] == [
        ("proxy", "holds 34 events, but the recorder wrote 35 (its run.finished counts)")
    ]
    # ... until the run's end goes too (the last event of its chain).
    tamper(store, "DELETE FROM events WHERE run_id = 'run-0' AND kind = 'run.finished'")
    assert problems(store) == []  # internally consistent now
    found = problems(store, anchored=[anchored])
    assert found and "anchored manifest" in found[0].what and "source proxy" in found[0].what
    del BODY_SQL


def test_missing_blob(store):
    with Store.open(store, read_only=True) as st:
        blob = st.con.execute(
            "SELECT request_blob FROM model_calls WHERE run_id = 'run-1' ORDER BY seq LIMIT 1 OFFSET 2"
        ).fetchall()[0][0]
        remove_blob(st.blobs, blob)
    found = problems(store)
    assert any(blob in p.what and "missing" in p.what and p.run_id == "run-1" for p in found)


def test_corrupted_blob(store):
    with Store.open(store, read_only=True) as st:
        blob = st.con.execute(
            "SELECT response_blob FROM model_calls WHERE run_id = 'run-2' LIMIT 1"
        ).fetchall()[0][0]
        replace_blob(st.blobs, blob, zlib.compress(b'{"tampered": true}'))
    found = problems(store)
    assert any(blob in p.what and "does not match its address" in p.what for p in found)
    with Store.open(store, read_only=True) as st:
        replace_blob(st.blobs, blob, b"garbage")
    assert any(blob in p.what and "cannot decompress" in p.what for p in problems(store))


@pytest.mark.parametrize("store", ["packed"], indirect=True)  # a migrated store's blobs are whole
def test_a_tampered_delta_base_fails_every_delta_built_on_it(store):
    """Requests are stored as deltas against the request before: a base changed (or removed) is
    reported itself, and so is every later request whose chain goes through it."""
    with Store.open(store, read_only=True) as st:
        requests = [
            r[0]
            for r in st.con.execute(
                "SELECT request_blob FROM model_calls WHERE run_id = 'run-1' ORDER BY seq"
            ).fetchall()
        ]
        later = [b for b in requests[3:] if getattr(st.blobs.entry(b[7:]), "codec", None) == ord("d")]
        assert len(later) >= 5
        replace_blob(st.blobs, requests[2], zlib.compress(b'{"messages": []}'))
    found = [p.what for p in problems(store)]
    assert any(requests[2] in w and "does not match its address" in w for w in found)
    for blob in later:
        assert any(blob in w and "delta base failed" in w for w in found), blob
    with Store.open(store, read_only=True) as st:
        remove_blob(st.blobs, requests[2])
    found = [p.what for p in problems(store)]
    assert any(later[0] in w and "delta base failed" in w and "missing" in w for w in found)


def test_verify_named_runs_only(store):
    tamper(store, "UPDATE events SET ts_ns = 0 WHERE run_id = 'run-2' AND seq = 1")
    assert problems(store, run_ids=["run-0", "run-1"]) == []
    assert problems(store, run_ids=["run-2"])
    assert problems(store, run_ids=["nope"])[0].what == "no such run in the store"


def test_manifest_is_stable_json(store):
    with Store.open(store, read_only=True) as st:
        m = manifests.stored(st.con, "run-0")
        assert m is not None and m == manifests.compute(st.con, "run-0")
    assert set(m) == {"format", "run_id", "sources", "events", "blob_refs", "manifest_hash"}
    assert json.loads(json.dumps(m)) == m


def test_a_manifests_hash_is_the_one_stored_manifests_carry():
    """Manifests stored before their hash was the codec's canonical digest were hashed over
    ``json.dumps(sort_keys=True, separators=(",", ":"))``; on what a manifest holds (ids, hex
    digests, whole numbers) both are the same bytes, so those stored hashes still verify."""
    rows = [
        ("run-0.a2", "proxy", 7, 6, "sha256:" + "ab" * 32),
        ("run-0.a2", "recorder", 2, 1, "sha256:" + "cd" * 32),
    ]
    m = manifests.assemble(rows, {"run-0.a2": 4})["run-0.a2"]
    body = {k: v for k, v in m.items() if k != "manifest_hash"}
    legacy = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert m["manifest_hash"] == "sha256:" + hashlib.sha256(legacy).hexdigest()


def test_a_run_deleted_whole_is_named_by_its_stored_manifest(store):
    """Every event of a run deleted: no chunk of the scan holds it, and its stored manifest still says so."""
    tamper(store, "DELETE FROM events WHERE run_id = 'run-1'")
    found = problems(store)
    assert [(p.run_id, p.what) for p in found] == [
        ("run-1", "differs from its stored manifest: run run-1 has no events in the store")
    ]


def test_chunks_of_one_run_find_what_one_chunk_finds(store):
    """Faults of every kind in several runs at once: read a run at a time (a batch of 5 events is
    smaller than any run) the store gives the same problems, in the same order, as read whole."""
    with Store.open(store, read_only=True) as st:
        blob = st.con.execute(
            "SELECT request_blob FROM model_calls WHERE run_id = 'run-2' ORDER BY seq LIMIT 1 OFFSET 1"
        ).fetchall()[0][0]
        remove_blob(st.blobs, blob)
    tamper(
        store,
        "UPDATE events SET ts_ns = ts_ns + 1 WHERE run_id = 'run-0' AND source = 'shim' AND seq = 3",
        "DELETE FROM events WHERE run_id = 'run-2' AND source = 'proxy' AND seq = 5",
        (
            "DELETE FROM events WHERE run_id = 'run-1' AND source = 'recorder' AND seq = (SELECT max(seq) "
            "FROM events WHERE run_id = 'run-1' AND source = 'recorder')"
        ),
    )
    whole = problems(store, batch=10**9)
    assert problems(store, batch=5) == whole
    assert {p.run_id for p in whole} == {"run-0", "run-1", "run-2"}
    assert any(blob in p.what for p in whole)


def damaged_spool_ingested(tmp_path, source):
    """A store of one run, run-0, whose ``source`` spool had a byte flipped (as an agent of the
    local backend can) before its ingest: ingest loads the run's other spools and refuses that one."""
    root = tmp_path / "store"
    generate_run(root, "run-0", seed=0, calls=6)
    spool = root / "spool" / "run-0" / f"{source}.spool"
    data = bytearray(spool.read_bytes())
    data[len(data) // 2] ^= 1
    spool.write_bytes(bytes(data))
    with pytest.raises(AmbError, match=f"{source}.spool"):
        ingest(root)
    return root


def test_a_spool_ingest_refused_leaves_its_run_failing_verify(tmp_path):
    # The proxy's spool refused: the run would look whole, with no model calls; the recorder's
    # run.finished counts say what is missing.
    root = damaged_spool_ingested(tmp_path, "proxy")
    found = problems(root)
    assert [(p.run_id, p.source) for p in found] == [("run-0", "proxy")], found
    assert found[0].what.startswith("holds 0 events, but the recorder wrote ")


def test_a_recorder_spool_ingest_refused_leaves_its_run_failing_verify(tmp_path):
    # The spool refused is the recorder's own: the proxy's and the shim's load, and the run has
    # neither run.started nor the run.finished whose counts would say what is missing.
    root = damaged_spool_ingested(tmp_path, "recorder")
    with Store.open(root, read_only=True) as st:
        assert st.con.execute("SELECT DISTINCT source FROM events ORDER BY 1").fetchall() == [
            ("proxy",),
            ("shim",),
        ]
        assert st.con.execute("SELECT status FROM runs").fetchall() == [("unfinished",)]
    found = problems(root)
    assert [str(p) for p in found] == [
        "run run-0: events from proxy, shim but no run.started from the recorder: the recorder's "
        "spool was not loaded (see `amb ingest`) or its events were removed"
    ]
    assert problems(root, run_ids=["run-0"]) == found
    result = CliRunner().invoke(cli, ["verify", "--store", str(root)])
    assert result.exit_code == 1 and "run run-0: events from proxy, shim but no run.started" in result.output


def test_the_recorders_events_deleted_whole_are_named(store):
    # A source's events deleted whole: the proxy's fall short of the run.finished counts; the
    # recorder's take those counts with them, and leave the run with no run.started.
    tamper(
        store,
        "DELETE FROM events WHERE run_id = 'run-1' AND source = 'recorder'",
        "DELETE FROM events WHERE run_id = 'run-2' AND source = 'proxy'",
    )
    found = [(p.run_id, p.source, p.what) for p in problems(store) if "manifest" not in p.what]
    assert [(r, src, what.split(":")[0]) for r, src, what in found] == [
        ("run-1", None, "events from proxy, shim but no run.started from the recorder"),
        ("run-2", "proxy", "holds 0 events, but the recorder wrote 35 (its run.finished counts)"),
    ], found
    assert {p.run_id for p in problems(store) if "manifest" in p.what} == {"run-1", "run-2"}


def test_a_run_still_recording_passes_verify(tmp_path):
    # A run ingested while it records: the recorder has written run.started (before the agent
    # started) and not yet run.finished; the proxy and the shim have what they have.
    root = tmp_path / "store"
    generate_run(root, "run-0", seed=0, calls=6)
    spool = root / "spool" / "run-0" / "recorder.spool"
    first = scan(spool.read_bytes()).bodies[0]
    assert decode_body(first).kind == "run.started"
    spool.write_bytes(MAGIC + encode_frame(first, hashlib.sha256(first).hexdigest()))
    ingest(root)
    with Store.open(root, read_only=True) as st:
        assert st.con.execute("SELECT status FROM runs").fetchall() == [("unfinished",)]
    assert problems(root) == []


def test_an_imported_run_needs_no_run_started_from_the_recorder(tmp_path):
    recorded, imported, out = tmp_path / "recorded", tmp_path / "imported", tmp_path / "atif"
    generate_run(recorded, "run-0", seed=0, calls=2)
    ingest(recorded)
    exported = CliRunner().invoke(
        cli, ["export", "atif", "run-0", "--out", str(out), "--store", str(recorded)]
    )
    assert exported.exit_code == 0, exported.output
    result = CliRunner().invoke(cli, ["import", "atif", str(out / "run-0"), "--store", str(imported)])
    assert result.exit_code == 0, result.output
    with Store.open(imported, read_only=True) as st:
        assert st.con.execute("SELECT DISTINCT run_id, source FROM events").fetchall() == [
            ("run-0", "import")
        ]
    assert problems(imported) == []


def test_hostile_run_finished_counts_are_read_as_what_they_can_be(tmp_path):
    root = tmp_path / "store"
    generate_run(root, "run-0", seed=0, calls=2)
    ingest(root)
    for counts in ('"x"', "[1]", '{"proxy": "9"}', '{"proxy": true}', '{"proxy": 1e400}', '{"": -5}'):
        tamper(
            root,
            f"UPDATE events SET payload = json_merge_patch(payload, '{{\"counts\": {counts}}}') "
            "WHERE kind = 'run.finished'",
        )
        # The edit itself is a hash mismatch; nothing else is read into it, and nothing fails.
        assert [("hash mismatch" in p.what, p.kind) for p in problems(root)] == [(True, "run.finished")]
