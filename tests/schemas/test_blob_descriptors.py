"""A process keeps no descriptor of a store it is done with: what writing runs into a store, ingesting
and reading them back opened (the pack it wrote, the writers' lock, packs and indexes read) is closed
once the last ``BlobStore`` of that store is closed or dropped. A test process, a server or a sweep
that goes through many stores would otherwise gather descriptors until ``select`` and the limit on
open files refuse it."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from recorder.synthetic import generate_run
from replay.ingest import ingest
from replay.store import Store
from schemas.blobstore import BlobStore
from tests.descriptors import open_targets


def open_under(root: Path) -> list[str]:
    """What this process has open under ``root``."""
    return sorted(t for t in open_targets() if t.startswith(str(root) + os.sep))


def write_and_read(store: Path) -> None:
    """Two runs written and ingested, then every blob of the store read back, then a blob put."""
    for seed in (1, 2):
        generate_run(store, f"run-{seed}", seed=seed, calls=3)
    ingest(store)
    st = Store.open(store, read_only=True)
    addresses = st.blobs.addresses()
    assert addresses and all(st.blobs.get("sha256:" + hexd) for hexd in addresses)
    st.close()
    BlobStore(store / "blobs").put(b"one more")


def test_stores_done_with_leave_no_descriptor_open(tmp_path):
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    stores = [tmp_path / f"store-{i}" for i in range(3)]
    for store in stores:
        write_and_read(store)
    assert open_under(tmp_path) == []
    # Not more than before (a descriptor an earlier test's thread or child pipe closes meanwhile may
    # make it fewer): none of the stores' descriptors, wherever they point, outlived them.
    assert len(os.listdir("/proc/self/fd")) <= before
    # What was written is there for the next process (the packs were sealed, not lost).
    for store in stores:
        st = Store.open(store, read_only=True)
        assert st.blobs.get(st.blobs.put(b"one more").blob) == b"one more"
        assert len(st.blobs.addresses()) > 1
        st.close()
        del st
    assert open_under(tmp_path) == []


def test_a_store_in_use_keeps_its_pack_while_another_object_of_it_is_dropped(tmp_path):
    kept = BlobStore(tmp_path)
    first = kept.put(b"first")
    passing = BlobStore(tmp_path)
    second = passing.put(b"second")
    del passing
    third = kept.put(b"third")
    assert [kept.get(r) for r in (first, second, third)] == [b"first", b"second", b"third"]
    assert len(kept.pack_files()) == 1, "one process, one store: one pack"
    assert any(t.endswith(".writers.lock") for t in open_under(tmp_path))
    del kept
    assert open_under(tmp_path) == []
