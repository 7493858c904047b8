"""The shim around a local run: processes, workspace changes and connects, against ground truth.

Real strace, real inotify, a real receiver writing a real spool and blob store.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from recorder.shim.local import run_local
from schemas.blobstore import BlobStore
from schemas.ostext import os_bytes, os_text
from tests.recorder.shim_helpers import payloads, shim_events

SCRIPT = textwrap.dedent("""\
    set -e
    echo one > a.txt
    echo two >> a.txt
    mkdir -p sub/deeper
    printf 'x%.0s' $(seq 100) > sub/deeper/b.bin
    mv a.txt out/renamed.txt
    echo gone > tmp.txt
    rm tmp.txt
    (cd sub && sh -c '/bin/true; exit 7' || true)
    exit 3
""")


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


TRACERS = ["seccomp-notify", "strace"]
"""Both process tracers; the tests run as root, where both work (auto takes the first)."""


@pytest.mark.parametrize("tracer", TRACERS)
def test_local_run_records_processes_and_file_changes(tmp_path: Path, tracer: str) -> None:
    store, ws = tmp_path / "store", tmp_path / "ws"
    # The rename goes into a directory that is there (and watched) from the start: a rename into one
    # made during the run is seen as a rename only if the watcher handled the mkdir first, which
    # under load it may not (tests/recorder/test_shim_watch.py pins down both cases).
    (ws / "out").mkdir(parents=True)
    result = run_local(store, "run-local-1", ws, ["bash", "-c", SCRIPT], tracer=tracer)
    assert result.exit_code == 3
    assert result.error is None
    events = shim_events(store, "run-local-1")
    blobs = BlobStore(store / "blobs")

    notes = payloads(events, "note")
    assert notes[0].text == "shim started" and notes[0].data["tracer"] == tracer
    assert notes[-1].text == "shim finished" and notes[-1].data["exit_code"] == 3

    procs = payloads(events, "process.exited")
    by_argv0: dict[str, Any] = {}
    for p in procs:
        by_argv0.setdefault(p.argv[0] if p.argv else "", []).append(p)
    root = [p for p in procs if p.argv[:2] == ["bash", "-c"]]
    assert len(root) == 1 and root[0].exit_code == 3 and root[0].cwd == str(ws.resolve())
    grandchild = [p for p in procs if p.argv == ["sh", "-c", "/bin/true; exit 7"]]
    assert len(grandchild) == 1 and grandchild[0].exit_code == 7
    assert grandchild[0].cwd == str((ws / "sub").resolve())
    true_ = [p for p in procs if p.argv == ["/bin/true"]]
    assert len(true_) == 1 and true_[0].ppid == grandchild[0].pid and true_[0].exit_code == 0
    mv = [p for p in procs if p.argv[:1] == ["mv"]]
    assert mv and mv[0].argv == ["mv", "a.txt", "out/renamed.txt"]
    assert all(p.tracer == tracer and p.end_ns >= p.start_ns > 0 for p in procs)

    writes = payloads(events, "file.written")
    a = [w for w in writes if w.path == "a.txt"]
    assert [w.op for w in a][0] == "created"
    assert blobs.get(a[-1].content) == b"one\ntwo\n"
    # b.bin is made in a directory made a moment before: the watcher may find it by scanning that
    # directory while printf still has it open (then its close reports the rest), so what must hold
    # is the last report, whole.
    b = [w for w in writes if w.path == "sub/deeper/b.bin"]
    assert b and b[0].op == "created" and b[-1].size == 100 and blobs.get(b[-1].content) == b"x" * 100
    assert b[-1].sha256 == _sha(b"x" * 100)
    renames = payloads(events, "file.renamed")
    assert [(r.src, r.dst) for r in renames] == [("a.txt", "out/renamed.txt")]
    # tmp.txt lives for a moment. Seen written, its deletion is reported; if the watcher got to its
    # close only after the rm (under load), neither is: inside the workspace the final state is what
    # matters (recorder/shim/watch.py).
    seen_tmp = [w.path for w in writes if w.path == "tmp.txt"][:1]
    assert [d.path for d in payloads(events, "file.deleted")] == seen_tmp
    # Final state agrees with the disk.
    assert (ws / "out/renamed.txt").read_bytes() == b"one\ntwo\n"


def test_content_cap_keeps_hash_only(tmp_path: Path) -> None:
    store, ws = tmp_path / "store", tmp_path / "ws"
    big = b"B" * 5000
    code = f"open('big.bin','wb').write({big!r}); open('small.txt','w').write('ok')"
    result = run_local(store, "run-cap", ws, [sys.executable, "-c", code], content_cap=1000)
    assert result.exit_code == 0
    writes = {w.path: w for w in payloads(shim_events(store, "run-cap"), "file.written")}
    assert writes["big.bin"].content is None and writes["big.bin"].size == 5000
    assert writes["big.bin"].sha256 == _sha(big)
    assert writes["small.txt"].content is not None


@pytest.mark.parametrize("tracer", TRACERS)
def test_connect_attempts_are_recorded(tmp_path: Path, tracer: str) -> None:
    # A port nobody listens on: the attempt fails, and the failure is the fact recorded.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    code = (
        f"import socket\ns=socket.socket()\ntry:\n s.connect(('127.0.0.1',{port}))\n"
        f"except OSError as e:\n print(e)\n"
    )
    store = tmp_path / "store"
    result = run_local(store, "run-net", tmp_path / "ws", [sys.executable, "-c", code], tracer=tracer)
    assert result.exit_code == 0
    reqs = payloads(shim_events(store, "run-net"), "network.request")
    hits = [r for r in reqs if r.port == port]
    assert len(hits) == 1
    assert hits[0].host == "127.0.0.1" and hits[0].via == "shim" and hits[0].error == "ECONNREFUSED"


def test_watched_path_reads_are_recorded(tmp_path: Path) -> None:
    secret = tmp_path / "private"
    secret.mkdir()
    (secret / "labels.csv").write_text("case,label\n")
    store = tmp_path / "store"
    result = run_local(
        store, "run-watch", tmp_path / "ws", ["cat", str(secret / "labels.csv")], watched=[str(secret)]
    )
    assert result.exit_code == 0
    accessed = payloads(shim_events(store, "run-watch"), "file.accessed")
    assert [(a.path, a.mode) for a in accessed] == [(str(secret / "labels.csv"), "r")]


def test_fallback_is_labelled(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = run_local(
        store, "run-poll", tmp_path / "ws", ["sh", "-c", "sleep 0.3; exit 5"], tracer="proc-poll"
    )
    assert result.exit_code == 5
    events = shim_events(store, "run-poll")
    notes = payloads(events, "note")
    assert notes[0].data["tracer"] == "proc-poll" and notes[0].data["fallback"] is True
    assert any("FALLBACK" in n.text for n in notes)
    procs = payloads(events, "process.exited")
    root = [p for p in procs if p.argv == ["sh", "-c", "sleep 0.3; exit 5"]]
    assert root and root[0].exit_code == 5 and root[0].tracer == "proc-poll"
    assert any(p.argv == ["sleep", "0.3"] for p in procs)  # long enough to be seen by polling


def test_rename_over_existing_and_directory_moves(tmp_path: Path) -> None:
    store, ws = tmp_path / "store", tmp_path / "ws"
    script = "echo 1 > x; echo 2 > y; mv x y; mkdir d; echo 3 > d/f; mv d e; echo 4 >> e/f"
    result = run_local(store, "run-mv", ws, ["sh", "-c", script])
    assert result.exit_code == 0
    events = shim_events(store, "run-mv")
    renames = [(r.src, r.dst) for r in payloads(events, "file.renamed")]
    assert ("x", "y") in renames and ("d", "e") in renames
    blobs = BlobStore(store / "blobs")
    last = {}
    for w in payloads(events, "file.written"):
        last[w.path] = blobs.get(w.content)
    assert last["e/f"] == b"3\n4\n"


def test_writes_outside_the_workspace_are_recorded_by_absolute_path(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "old.txt").write_text("there before")
    store = tmp_path / "store"
    script = f"echo cache > {scratch}/new.bin; echo in-ws > w.txt; rm {scratch}/old.txt"
    result = run_local(store, "run-out", tmp_path / "ws", ["sh", "-c", script], outside=[str(scratch)])
    assert result.exit_code == 0
    events = shim_events(store, "run-out")
    writes = {w.path: w for w in payloads(events, "file.written")}
    assert set(writes) == {str(scratch / "new.bin"), "w.txt"}
    assert BlobStore(store / "blobs").get(writes[str(scratch / "new.bin")].content) == b"cache\n"
    assert [d.path for d in payloads(events, "file.deleted")] == [str(scratch / "old.txt")]


def test_nothing_outside_is_skipped_and_the_shim_keeps_its_files_elsewhere(tmp_path: Path) -> None:
    """The shim's old private prefix (amb-shim-*) hides nothing any more, a file written and deleted
    before the shim read it still leaves its deletion, and strace's fifo lives in --private-dir."""
    scratch, private = tmp_path / "scratch", tmp_path / "private"
    scratch.mkdir()
    private.mkdir(mode=0o700)
    store = tmp_path / "store"
    script = (
        f"mkdir -p {scratch}/amb-shim-hide && echo hidden > {scratch}/amb-shim-hide/x.txt; "
        f"echo brief > {scratch}/gone.txt && rm {scratch}/gone.txt; ls {private} > seen.txt"
    )
    result = run_local(
        store,
        "run-hide",
        tmp_path / "ws",
        ["sh", "-c", script],
        outside=[str(scratch)],
        tracer="strace",
        private_dir=str(private),
    )
    assert result.exit_code == 0
    events = shim_events(store, "run-hide")
    writes = {w.path for w in payloads(events, "file.written")}
    assert str(scratch / "amb-shim-hide" / "x.txt") in writes
    touched = writes | {d.path for d in payloads(events, "file.deleted")}
    assert str(scratch / "gone.txt") in touched
    # strace's fifo directory was made under the private dir (and removed), never in a watched one.
    assert not any("amb-shim-" in p and "hide" not in p for p in writes)
    assert (tmp_path / "ws" / "seen.txt").read_text().startswith("amb-shim-")


NAMES_SCRIPT = textwrap.dedent("""\
    set -e
    d=$(printf 'd\\376'); x=$(printf 'x\\377'); y=$(printf 'y\\375'); e='a\\b \\xff'
    mkdir "$d"
    printf one > "$d/$x"
    printf two > "$e"
    sleep 0.3
    mv "$d/$x" "$y"
    rm "$e"
    cd "$d" && sh -c 'sleep 0.3; true' "$x"
""")
"""An agent whose names are not UTF-8: a directory, a file in it renamed, one whose name has
backslashes and looks like an escape (``a\\b \\xff``, made and deleted), and a program whose argv
and cwd hold such bytes. The pause lets the watcher read the files before they move."""


@pytest.mark.parametrize("tracer", [*TRACERS, "proc-poll"])
def test_names_that_are_not_utf8_are_recorded_with_every_byte(tmp_path: Path, tracer: str) -> None:
    store, ws = tmp_path / "store", tmp_path / "ws"
    result = run_local(store, "run-bytes", ws, ["bash", "-c", NAMES_SCRIPT], tracer=tracer)
    assert (result.exit_code, result.error) == (0, None)  # (main: the tracer stopped the agent, exit 125)
    events = shim_events(store, "run-bytes")
    blobs = BlobStore(store / "blobs")
    written = {w.path: blobs.get(w.content) for w in payloads(events, "file.written")}
    assert written == {os_text(b"d\xfe/x\xff"): b"one", os_text(b"a\\b \\xff"): b"two"}
    assert "a\\\\b \\\\xff" in written  # the name's own backslashes doubled: no byte 0xff there
    renamed = [(r.src, r.dst) for r in payloads(events, "file.renamed")]
    assert renamed == [(os_text(b"d\xfe/x\xff"), os_text(b"y\xfd"))]
    assert [d.path for d in payloads(events, "file.deleted")] == [os_text(b"a\\b \\xff")]
    procs = payloads(events, "process.exited")
    sh = [p for p in procs if [os_bytes(a) for a in p.argv] == [b"sh", b"-c", b"sleep 0.3; true", b"x\xff"]]
    assert len(sh) == 1 and os_bytes(sh[0].cwd) == os.fsencode(ws.resolve()) + b"/d\xfe"
    if tracer != "proc-poll":  # (polling may miss a process this short)
        assert [os_bytes(a) for p in procs if p.argv[:1] == ["mkdir"] for a in p.argv] == [b"mkdir", b"d\xfe"]
    assert not [n for n in payloads(events, "note") if "could not" in n.text]
    assert result.shim_counts["unsendable"] == result.shim_counts["watch_errors"] == 0
    assert sorted(os.listdir(os.fsencode(ws))) == [b"d\xfe", b"y\xfd"]


def test_a_recorder_package_in_the_workspace_is_never_the_shim(tmp_path: Path) -> None:
    """The local backend starts the shim in the agent's workspace (tests/recorder/test_run_local.py):
    a ``recorder`` package an agent left there is not what runs."""
    import subprocess

    from recorder.shim.local import importable, shim_argv

    ws = tmp_path / "ws"
    planted = ws / "recorder" / "shim"
    planted.mkdir(parents=True)
    (ws / "recorder" / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text("import pathlib; pathlib.Path('planted').write_text('ran')\n")
    argv = shim_argv(str(tmp_path / "no-receiver.sock"), str(ws), ["true"])
    subprocess.run(argv, cwd=ws, env=importable(dict(os.environ)), capture_output=True, timeout=60)
    assert not (ws / "planted").exists()
