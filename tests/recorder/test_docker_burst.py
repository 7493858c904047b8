"""A burst inside the container: 5,000 files written within 10 s are all recorded, none lost.

Reports the shim's CPU cost (the shim's Python process plus strace) for the burst; run with -s to
see it. Needs dockerd (CI starts it with .ci/dockerd.sh); never skipped.
"""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

from recorder.docker_backend import DockerBackend
from recorder.run import RunSpec, record
from tests.recorder.shim_helpers import payloads, shim_events

N = 5000

BURST = textwrap.dedent(f"""
    import os, time
    t0 = time.monotonic()
    for d in range(50):
        os.makedirs(f"burst/d{{d:02d}}", exist_ok=True)
    for i in range({N}):
        with open(f"burst/d{{i % 50:02d}}/f{{i:05d}}.txt", "w") as f:
            f.write(f"file {{i}}\\n" * (1 + i % 7))
    took = time.monotonic() - t0
    print(f"BURST {{took:.3f}}s")
    assert took < 10, took
""")


def test_burst_of_5000_files_is_fully_recorded(tmp_path: Path, agent_image: str) -> None:
    store = tmp_path / "store"
    outcome = record(
        RunSpec(argv=["python3", "-c", BURST], store=store, run_id="burst", time_limit_s=120),
        DockerBackend(agent_image, stream_output=False),
    )
    assert outcome.status == "completed", outcome
    events = shim_events(store, "burst")
    writes = payloads(events, "file.written")
    expected = {
        f"burst/d{i % 50:02d}/f{i:05d}.txt": "sha256:"
        + hashlib.sha256(f"file {i}\n".encode() * (1 + i % 7)).hexdigest()
        for i in range(N)
    }
    last = {}
    for w in writes:
        last[w.path] = w.sha256
    missing = sorted(set(expected) - set(last))
    assert not missing, f"{len(missing)} files not recorded, e.g. {missing[:5]}"
    wrong = [p for p in expected if last[p] != expected[p]]
    assert not wrong, f"{len(wrong)} files recorded with the wrong content, e.g. {wrong[:5]}"
    assert all(w.content is not None for w in writes)
    # Gap-free: every event the shim sent was appended (seq 0..n-1, verified by the decoder's chain).
    assert [e.seq for e in events] == list(range(len(events)))
    finished = [n for n in payloads(events, "note") if n.text == "shim finished"][-1].data
    cpu_ms = finished["cpu_ms_shim"] + finished.get("cpu_ms_strace", 0)
    print(
        f"\nshim CPU for {N} files: {cpu_ms} ms ({finished['cpu_ms_shim']} ms shim + "
        f"{finished.get('cpu_ms_strace', 0)} ms strace), {finished['written']} writes, "
        f"{finished['overflows']} inotify overflows, {finished['rescans']} rescans"
    )
    assert finished["written"] >= N
