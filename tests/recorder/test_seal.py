"""``seal_directory`` on workspaces an agent shaped: folders nested deeper than any walk should
follow, links to folders, folders and files it may not read, and the listing's order against an
independent walk."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from recorder.backend import SEAL_MAX_DEPTH, seal_directory
from schemas.blobstore import BlobStore
from schemas.tempdirs import make_tempdir, remove_tempdir
from tests.recorder.ordinary_user import CHECKOUT, NOBODY, as_nobody, nobody_dir


def _nest(where: Path, depth: int) -> None:
    """Folders ``d/d/...`` ``depth`` deep with a file at the bottom, made one level at a time (as an
    agent can, far past the length a whole path may have)."""
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("deep")
    finally:
        os.close(fd)


def _unnest(where: Path) -> None:
    """Remove what ``_nest`` made, bottom up, one level at a time (a recursive removal, pytest's
    own among them, fails on it)."""
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    depth = 0
    while "d" in os.listdir(fd):
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, depth = inner, depth + 1
    with contextlib.suppress(FileNotFoundError):
        os.unlink("f", dir_fd=fd)
    for _ in range(depth):
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = parent
        os.rmdir("d", dir_fd=fd)
    os.close(fd)


def test_folders_nested_thousands_deep_are_left_out_by_name(tmp_path):
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    (ws / "out" / "submission.json").write_text("{}")
    try:
        _nest(ws, 1500)
        sealed = seal_directory(ws, BlobStore(tmp_path / "blobs"))
    finally:
        _unnest(ws)
    assert [f.path for f in sealed.files] == ["out/submission.json"]
    assert sealed.skipped == ["d/" * (SEAL_MAX_DEPTH + 1) + f": more than {SEAL_MAX_DEPTH} folders deep"]


def test_the_listing_is_an_independent_walks_and_links_to_folders_are_named(tmp_path):
    ws = tmp_path / "ws"
    for rel in ("b/z.txt", "b/a/y.txt", "a.txt", "c/d/e/x.bin", "b.txt"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_bytes(rel.encode())
    (ws / "c" / "up").symlink_to(tmp_path)  # a link to a folder outside: never followed
    (ws / "c" / "f").symlink_to(ws / "a.txt")
    expected = []
    for dirpath, dirnames, filenames in os.walk(ws):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not path.is_symlink():
                expected.append(path.relative_to(ws).as_posix())
    sealed = seal_directory(ws, BlobStore(tmp_path / "blobs"))
    assert [f.path for f in sealed.files] == expected
    assert sorted(sealed.skipped) == ["c/f: symlink", "c/up: symlink"]


def test_a_tree_nested_thousands_deep_is_removed_with_its_temp_folder(tmp_path):
    # The docker backend's workspace is a temp folder the agent fills: removing it must not fail
    # where a recursive removal does.
    folder = make_tempdir("amb-test-deep-", tmp_path)
    try:
        _nest(folder, 1500)
        remove_tempdir(folder)
        assert not folder.exists()
    finally:
        if folder.exists():
            _unnest(folder)


SEAL = """
import json, sys
from pathlib import Path
from recorder.backend import seal_directory
from schemas.blobstore import BlobStore
home = Path(sys.argv[1])
sealed = seal_directory(home / "ws", BlobStore(home / "blobs"))
print(json.dumps({"files": [f.path for f in sealed.files], "skipped": sealed.skipped}))
"""


def test_folders_and_files_the_recorder_may_not_read_are_named_and_the_rest_sealed(tmp_path):
    # Root reads everything: the seal runs as an ordinary user, over a workspace that user owns, in
    # which the agent closed a folder and a file to its owner.
    with nobody_dir("amb-seal-") as home:
        ws = home / "ws"
        for rel in ("out/submission.json", "closed/x.txt", "secret.txt"):
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_text(rel)
        stage = tmp_path / "stage"
        stage.mkdir()
        for path in (ws, *ws.rglob("*"), stage):
            os.chown(path, NOBODY, NOBODY)
        (ws / "closed").chmod(0)
        (ws / "secret.txt").chmod(0)
        proc = subprocess.run(
            as_nobody([sys.executable, "-c", SEAL, str(home)], stage),
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(CHECKOUT)},
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    sealed = json.loads(proc.stdout)
    assert sealed == {
        "files": ["out/submission.json"],
        "skipped": ["closed/: unreadable (Permission denied)", "secret.txt: unreadable (Permission denied)"],
    }
