"""The spool writer: durability under kill -9, group commit, resume after a torn tail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from recorder.spool import SpoolWriter, spool_path
from replay.ingest import ingest
from replay.store import Store
from schemas.codec import decode_body
from schemas.events import Note
from schemas.frames import scan

ROOT = Path(__file__).parents[2]

WRITER = r"""
import sys
from recorder.spool import SpoolWriter, spool_path
from schemas.events import Note
w = SpoolWriter(spool_path(sys.argv[1], "burst", "proxy"), "burst", "proxy")
i = 0
while True:
    # A mix of small and large frames, so that a kill can land inside a big write.
    w.append(Note(text=("x" * 2_000_000 if i % 7 == 3 else f"event {i}")))
    print(i, flush=True)  # acknowledged: append returned, so the frame is durable
    i += 1
"""


def test_sigkill_mid_burst_loses_no_acknowledged_frame(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    acked: list[Any] = []
    deadline = time.monotonic() + 60
    while len(acked) < 60 and time.monotonic() < deadline:
        assert proc.stdout is not None
        acked.append(int(proc.stdout.readline()))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.stdout is not None
    rest = proc.stdout.read().split()
    acked += [int(x) for x in rest]
    assert len(acked) >= 60
    report = ingest(tmp_path)
    with Store.open(tmp_path, read_only=True) as st:
        seqs = [
            r[0]
            for r in st.con.execute("SELECT seq FROM events WHERE run_id = 'burst' ORDER BY seq").fetchall()
        ]
    assert seqs == list(range(len(seqs)))
    assert set(acked) <= set(seqs), "an acknowledged frame was lost"
    for torn in report.torn:  # if the kill landed mid-frame, the tail is reported, not loaded
        assert torn.frames == len(seqs)


def test_resume_truncates_torn_tail_and_continues_the_chain(tmp_path):
    path = spool_path(tmp_path, "r", "shim")
    with SpoolWriter(path, "r", "shim") as w:
        for i in range(3):
            w.append(Note(text=str(i)))
    path.write_bytes(path.read_bytes()[:-5])
    w = SpoolWriter(path, "r", "shim")
    assert w.recovered_tail is not None and w.next_seq == 2
    w.append(Note(text="after restart"))
    w.close()
    bodies = scan(path.read_bytes()).bodies
    assert [decode_body(b).seq for b in bodies] == [0, 1, 2]
    assert ingest(tmp_path).events_added == 3  # the chain is intact across the restart


def test_group_commit_shares_fsyncs(tmp_path, monkeypatch):
    calls = []
    real_fsync = os.fsync

    def slow_fsync(fd):
        calls.append(fd)
        time.sleep(0.01)
        real_fsync(fd)

    w = SpoolWriter(spool_path(tmp_path, "r", "proxy"), "r", "proxy")
    monkeypatch.setattr(os, "fsync", slow_fsync)
    threads = [
        threading.Thread(target=lambda: [w.append(Note(text="x")) for _ in range(20)]) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    assert w.next_seq == 160
    assert len(calls) < 160 / 2, f"{len(calls)} fsyncs for 160 appends: no grouping"
    assert len(scan(spool_path(tmp_path, "r", "proxy").read_bytes()).bodies) == 160


def test_writer_refuses_a_spool_of_another_run(tmp_path):
    import pytest

    from schemas.errors import SpoolError

    path = spool_path(tmp_path, "a", "proxy")
    with SpoolWriter(path, "a", "proxy") as w:
        w.append(Note(text="x"))
    with pytest.raises(SpoolError, match="belongs to a/proxy"):
        SpoolWriter(path, "b", "proxy")
