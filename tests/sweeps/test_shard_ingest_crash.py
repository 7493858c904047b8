"""``amb ingest --from`` killed outright (SIGKILL) at each step of a batched load loses nothing and
mixes no attempts: loading again gives the store a clean load gives, event for event.

The kill comes from inside the loading process, at a chosen point (after a batch's blobs are made
durable and before its spools exist; after a batch's spools are in; while spools are compressed
after the database commit), so each crash point is hit every time rather than by timing luck."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from replay.spools import compressed_path
from replay.spools import read_bytes as read_spool
from replay.store import Store
from sweeps.collect import select
from sweeps.shard import Layout
from sweeps.spec import Cell, run_id
from tests.sweeps.shard_helpers import make_shard
from tests.sweeps.test_shards import amb

ROOT = Path(__file__).parents[2]

# Runs in a child interpreter: a small batch size, and a SIGKILL of itself at the chosen point.
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path

    import replay.shards as shards
    import replay.spools as spools
    from schemas.blobstore import BlobStore
    from sweeps.collect import select
    from sweeps.shard import Layout

    point, store, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    shards.BATCH_SHARDS = 3
    seen = {"n": 0}

    def count_then_die(limit):
        seen["n"] += 1
        if seen["n"] == limit:
            os.kill(os.getpid(), signal.SIGKILL)

    if point == "blobs-flushed":  # the second batch's blobs are on disk, its spools not yet
        flush = BlobStore.flush
        def flush_then_die(self):
            flush(self)
            count_then_die(2)
        BlobStore.flush = flush_then_die
    elif point == "spools-copied":  # two batches' spools are in the store, nothing ingested
        copy = shards._copy_batch
        def copy_then_die(*args):
            out = copy(*args)
            count_then_die(2)
            return out
        shards._copy_batch = copy_then_die
    elif point == "settling":  # the database has every event; the third spool is being compressed
        compress = spools._compress
        def compress_then_die(spool, data):
            count_then_die(3)
            compress(spool, data)
        spools._compress = compress_then_die
    shards.load_shards(store, select(Layout(root)).take)
    print("not killed")
    """
)


def _events(store: Path) -> dict[tuple[str, str], list[str]]:
    with Store.open(store, read_only=True) as st:
        rows = st.con.execute(
            "SELECT run_id, source, hash FROM events ORDER BY run_id, source, seq"
        ).fetchall()
    out: dict[tuple[str, str], list[str]] = {}
    for rid, source, h in rows:
        out.setdefault((rid, source), []).append(h)
    return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Layout, dict[tuple[str, str], list[str]]]:
    """Ten cells; one with a failed first attempt, a completed second and a duplicate of it. Returns
    the shard root and what a clean load stores."""
    layout = Layout(tmp_path_factory.mktemp("crash") / "sweep")
    layout.make()
    for i in range(1, 10):
        make_shard(layout, Cell("s", "agent", "bccd-det", "lite", i), seed=i)
    mixed = Cell("s", "agent", "bccd-det", "standard", 1)
    make_shard(layout, mixed, 1, status="failed", seed=20)
    make_shard(layout, mixed, 2, seed=21)
    make_shard(layout, mixed, 2, seed=22)  # a second execution of attempt 2: a duplicate
    clean = layout.root.parent / "clean"
    proc = amb("ingest", "--store", str(clean), "--from", str(layout.root))
    assert proc.returncode == 0, proc.stderr
    return layout, _events(clean)


@pytest.mark.parametrize("point", ["blobs-flushed", "spools-copied", "settling"])
def test_a_killed_ingest_loses_nothing_and_mixes_nothing(tmp_path, sweep, point):
    layout, clean = sweep
    store = tmp_path / "store"
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, point, str(store), str(layout.root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr

    again = amb("ingest", "--store", str(store), "--from", str(layout.root))
    assert again.returncode == 0, again.stderr
    assert _events(store) == clean
    verify = amb("verify", "--store", str(store))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # The cell's stored run is its placed attempt 2, byte for byte, not the duplicate's.
    taken = dict((rid, shard) for shard, rid in select(layout).take)
    rid = run_id(Cell("s", "agent", "bccd-det", "standard", 1), 2)
    for name in ("recorder.spool", "proxy.spool", "shim.spool"):
        kept = store / "spool" / rid / name
        stored = read_spool(kept if kept.exists() else compressed_path(kept))
        assert stored == (taken[rid] / "spool" / rid / name).read_bytes()
