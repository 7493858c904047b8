"""``amb gc`` knows every kind of entry amb makes in the temp dir: whatever a process that was killed
left (its temp dirs of every kind, the image build lock, an owner lock it was making) is removed and
named, and what a live process holds is not. Every such entry is made through ``schemas.tempdirs``
(checked here on the sources), which names it in its owner's lock before it exists."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.test_architecture import PACKAGES, ROOT, sources

BIN = Path(sys.executable).parent

KINDS = (
    "amb-agent-ctx-",  # an image's build context (amb/images.py)
    "amb-rootfs-",  # a debootstrapped base (amb/images.py)
    "amb-ingest-",  # ingest's decompressed spools (replay/ingest.py)
    "amb-ingest-copies-",  # ingest's copies of spools that changed while read
    "amb-sub-",  # a submission being graded (scorer/taskgrade.py)
    "amb-ws-gc-kinds-",  # a sweep execution's workspace (sweeps/exec.py)
    "amb-shim-sock-",  # the local shim's socket (recorder/local_backend.py, recorder/shim/local.py)
)

OWNER = """
import json, os, signal, sys, tempfile
from pathlib import Path
from amb.images import build_lock
from schemas.tempdirs import make_tempdir

how, kinds = sys.argv[1], sys.argv[2:]
made = [str(make_tempdir(kind)) for kind in kinds]
if how == "dies":
    with build_lock():
        # An owner lock being made when the process died: left aside, never renamed into place.
        aside = Path(tempfile.gettempdir()) / "amb-runs" / f".x.lock.{os.getpid()}.new"
        aside.write_text("")
        print(json.dumps(made + [str(aside)]), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
print(json.dumps(made), flush=True)
sys.stdin.read()  # lives until its input closes
"""

pytestmark = pytest.mark.usefixtures("gc_alone")  # no other test's `amb gc` meanwhile (tests/conftest.py)


def test_gc_removes_every_kind_of_dead_entry_and_no_live_one(tmp_path: Path, monkeypatch) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="amb-gck-"))
    env = {**os.environ, "TMPDIR": str(tmp)}
    live = subprocess.Popen(
        [sys.executable, "-c", OWNER, "lives", *KINDS],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert live.stdout is not None
        live_made = json.loads(live.stdout.readline())
        dead = subprocess.run(
            [sys.executable, "-c", OWNER, "dies", *KINDS], env=env, capture_output=True, text=True, timeout=60
        )
        assert dead.returncode == -signal.SIGKILL, dead.stderr
        dead_made = json.loads(dead.stdout)
        images_lock = tmp / f"amb-images-{os.geteuid()}.lock"
        assert all(Path(p).exists() for p in dead_made + live_made) and images_lock.exists()

        proc = subprocess.run(
            [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, proc.stderr
        removed = {(r["run_id"], r["kind"], r["name"]) for r in json.loads(proc.stdout)["removed"]}
        dead_lock = [n for _, k, n in removed if k == "lock" and "/amb-runs/proc@" in n]
        assert removed == {
            *((None, "path", p) for p in dead_made[:-1]),
            (None, "lock", dead_made[-1]),
            (None, "lock", str(images_lock)),
            (None, "lock", dead_lock[0]),
        }, removed
        assert not any(Path(p).exists() for p in dead_made) and not images_lock.exists()
        assert all(Path(p).is_dir() for p in live_made)

        # A held build lock is left alone too.
        from amb.images import build_lock
        from recorder.gc import collect

        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        with build_lock():
            assert collect(docker=False) == ([], [])
            assert images_lock.exists()
        assert not images_lock.exists()  # its last holder removed it
    finally:
        live.communicate(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


MAKERS = {"mkdtemp", "mkstemp", "TemporaryDirectory", "NamedTemporaryFile"}
"""tempfile's makers of named entries (a ``TemporaryFile`` has no name: it leaves nothing behind)."""


def test_every_temp_entry_is_made_through_schemas_tempdirs() -> None:
    """Nothing of amb makes a temp entry of its own (one ``amb gc`` would not know): tempfile's makers
    are called only with an explicit ``dir`` (outside the temp dir), or in schemas/tempdirs.py."""
    found = []
    for package in PACKAGES:
        for path in sources(package):
            if path == ROOT / "schemas" / "tempdirs.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                if node.func.attr in MAKERS and not any(k.arg == "dir" for k in node.keywords):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.attr}")
    assert not found, f"use schemas.tempdirs (make_tempdir, tempdir) instead: {found}"


def test_a_lock_directory_of_someone_else_is_one_clear_error(tmp_path: Path) -> None:
    """A lock directory another user made (or a link planted in its place) is never written to: amb
    says so in one line and makes nothing in the temp dir it could not name."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for plant in ("theirs", "link"):
        locks = tmp / "amb-runs"
        if plant == "theirs":
            locks.mkdir(mode=0o755)
            (locks / "theirs").write_text("")  # not empty: an empty one is removed (by gc) and made anew
            os.chown(locks, 65534, 65534)  # nobody's, and not sticky like /tmp
        else:
            locks.symlink_to(tmp_path)
        proc = subprocess.run(
            [str(BIN / "amb-record"), "--store", str(tmp_path / "store"), "--no-ingest", "--", "true"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip() == (
            f"amb-record: error: {locks} is not a directory amb can trust and write to (a link, or another "
            "user's): remove it, or set TMPDIR to a directory of your own"
        )
        assert sorted(p.name for p in tmp.iterdir()) == ["amb-runs"]
        if plant == "theirs":
            shutil.rmtree(locks)
        else:
            locks.unlink()


RELEASES = """
import json, subprocess, sys
from recorder.runlock import RunLock

lock = RunLock(sys.argv[1])
kept, stuck = lock.make_tempdir("amb-kept-"), lock.make_tempdir("amb-stuck-")
(kept / "ca").mkdir()
# A mount point: nothing may remove it while mounted (the mount lives in this process's namespace).
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(stuck)], check=True)
lock.release()
print(json.dumps({"kept": kept.exists(), "stuck": stuck.exists(), "lock": lock.path.exists()}))
"""


def test_a_run_lock_released_removes_what_it_names_or_stays_for_gc(tmp_path: Path) -> None:
    """A run's clean end removes the temp dirs its lock names even when the recorder's own removal was
    skipped; one that resists keeps the lock file, free, so that ``amb gc`` removes it later (an entry
    of amb's in the temp dir is never left unnamed)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", RELEASES, "rel-1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"kept": False, "stuck": True, "lock": True}
    (stuck,) = tmp.glob("amb-stuck-*")
    assert not list(tmp.glob("amb-kept-*"))
    gc = subprocess.run(
        [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert gc.returncode == 0, gc.stderr
    removed = {(r["run_id"], r["kind"], r["name"]) for r in json.loads(gc.stdout)["removed"]}
    assert ("rel-1", "path", str(stuck)) in removed, removed
    assert sorted(p.name for p in tmp.iterdir()) == []


DIES_MOUNTED = """
import os, subprocess, sys
from recorder.runlock import RunLock

lock = RunLock(sys.argv[1])
stuck = lock.make_tempdir("amb-stuck-")
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(stuck)], check=True)
os._exit(9)  # gone without releasing: the lock stays, free
"""

COLLECTS = """
import json
from recorder.gc import collect

removed, problems = collect(docker=False)
print(json.dumps({"removed": [r.kind for r in removed], "problems": problems}))
"""


def test_gc_keeps_a_dead_lock_while_what_it_names_resists(tmp_path: Path) -> None:
    """A dead owner's dir that cannot be removed (a mount point) is reported, and its lock stays so that
    a later gc finds it again; once it can go, it goes with the lock."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    script = f"{sys.executable} -c '{DIES_MOUNTED}' gone-1; {sys.executable} -c '{COLLECTS}'"
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    assert said["removed"] == [] and "could not be removed" in said["problems"][0], (said, proc.stderr)
    assert (tmp / "amb-runs" / "gone-1.lock").exists()
    gc = subprocess.run(
        [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert gc.returncode == 0, gc.stderr
    assert sorted(p.name for p in tmp.iterdir()) == []


SHRINKS_AND_DIES = """
import os, sys
from recorder.runlock import RunLock

lock = RunLock(sys.argv[1])
kept = lock.make_tempdir("amb-kept-")
gone = lock.make_tempdir("amb-gone-")
os.rmdir(gone)
lock.forget(gone)  # a shorter rewrite of the lock file
print(kept, flush=True)
os._exit(9)
"""


def test_a_lock_rewritten_shorter_then_killed_still_names_its_entries(tmp_path: Path) -> None:
    """A lock file is rewritten in place as its owner makes and forgets entries. After a shorter
    rewrite the file holds exactly the new contents; a kill between writing and cutting to length
    leaves the older, longer tail after them, and gc still reads every entry the lock names."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.run(
        [sys.executable, "-c", SHRINKS_AND_DIES, "shrunk-1"], capture_output=True, text=True, env=env
    )
    kept = proc.stdout.strip()
    lock = tmp / "amb-runs" / "shrunk-1.lock"
    info = json.loads(lock.read_bytes())  # the whole file is one JSON value: no tail
    assert info["paths"] == [kept], (info, proc.stderr)
    # What a kill between the write and the cut leaves: the new contents, then an old tail.
    lock.write_bytes(lock.read_bytes() + b', "x"]}')
    gc = subprocess.run(
        [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert gc.returncode == 0, gc.stderr
    removed = {(r["run_id"], r["kind"], r["name"]) for r in json.loads(gc.stdout)["removed"]}
    assert ("shrunk-1", "path", kept) in removed, removed
    assert sorted(p.name for p in tmp.iterdir()) == []
