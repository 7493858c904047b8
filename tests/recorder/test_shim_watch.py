"""The shim's workspace watcher when it lags behind the agent: real inotify, one batch at a time.

The watcher runs on its own thread and reads inotify's queue every 50 ms; under load many changes
arrive in one batch and are handled after the disk has moved on. These tests make that happen
on purpose (the changes first, then one ``poll``), so what the watcher reports in each case is
exact, not a matter of scheduling.
"""

from __future__ import annotations

import os
from pathlib import Path

from recorder.shim.watch import Watcher
from recorder.shim.wire import Delete, Rename, Write


def _watch(ws: Path) -> tuple[Watcher, list[object]]:
    seen: list[object] = []
    return Watcher(str(ws), seen.append, content_cap=1 << 20), seen


def _drain(watcher: Watcher) -> None:
    while watcher.poll(0.0):
        pass


def _facts(seen: list[object]) -> list[tuple]:
    """What a reader of the record learns: each change, in order, without times."""
    out: list[tuple] = []
    for m in seen:
        if isinstance(m, Write):
            out.append(("write", m.path, m.op, m.content))
        elif isinstance(m, Rename):
            out.append(("rename", m.src, m.dst))
        elif isinstance(m, Delete):
            out.append(("delete", m.path))
    return out


def _replayed(seen: list[object]) -> dict[str, bytes | None]:
    """The workspace the record describes (path -> content)."""
    files: dict[str, bytes | None] = {}
    for m in seen:
        if isinstance(m, Write):
            files[m.path] = m.content
        elif isinstance(m, Rename):
            files[m.dst] = files.pop(m.src)
        elif isinstance(m, Delete):
            files.pop(m.path, None)
    return files


def test_a_file_renamed_before_its_close_was_handled_is_reported_written_then_renamed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    watcher, seen = _watch(ws)
    (ws / "a.txt").write_bytes(b"one\n")
    with open(ws / "a.txt", "ab") as f:
        f.write(b"two\n")
    (ws / "a.txt").rename(ws / "out" / "renamed.txt")
    _drain(watcher)  # both closes and the rename in one batch: a.txt is gone when its close is handled
    watcher.finish()
    assert _facts(seen) == [
        ("write", "a.txt", "created", b"one\ntwo\n"),
        ("rename", "a.txt", "out/renamed.txt"),
    ]


def test_a_file_renamed_after_its_close_was_handled_is_reported_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    watcher, seen = _watch(ws)
    (ws / "a.txt").write_bytes(b"one\n")
    _drain(watcher)
    (ws / "a.txt").rename(ws / "out" / "renamed.txt")
    _drain(watcher)
    watcher.finish()
    assert _facts(seen) == [("write", "a.txt", "created", b"one\n"), ("rename", "a.txt", "out/renamed.txt")]


def test_a_rename_into_a_directory_not_yet_watched_leaves_the_right_final_state(tmp_path: Path) -> None:
    # The directory's watch is added when its creation is handled, after the rename happened, so
    # inotify never says where a.txt went: the file is reported where it is, under its new name,
    # and nothing is claimed about a.txt (it was never read). What the record rebuilds is the disk.
    ws = tmp_path / "ws"
    ws.mkdir()
    watcher, seen = _watch(ws)
    (ws / "a.txt").write_bytes(b"one\n")
    (ws / "new").mkdir()
    (ws / "a.txt").rename(ws / "new" / "renamed.txt")
    _drain(watcher)
    watcher.finish()
    assert _facts(seen) == [("write", "new/renamed.txt", "created", b"one\n")]
    assert _replayed(seen) == {"new/renamed.txt": b"one\n"}


def test_a_known_file_moved_into_a_directory_not_yet_watched_is_reported_renamed(tmp_path: Path) -> None:
    # What `mkdir -p out; mv notes.txt out/` looks like to a watcher that lags: the directory's
    # creation is handled after the move, so inotify gives a MOVED_FROM and no MOVED_TO. The scan of
    # the new directory finds the file (same size, mtime and content as the one that left): a rename.
    ws = tmp_path / "ws"
    ws.mkdir()
    watcher, seen = _watch(ws)
    (ws / "notes.txt").write_bytes(b"one\n")
    _drain(watcher)
    (ws / "out").mkdir()
    (ws / "notes.txt").rename(ws / "out" / "notes.txt")
    _drain(watcher)
    watcher.finish()
    assert _facts(seen) == [
        ("write", "notes.txt", "created", b"one\n"),
        ("write", "out/notes.txt", "created", b"one\n"),
        ("rename", "notes.txt", "out/notes.txt"),
    ]
    assert _replayed(seen) == {"out/notes.txt": b"one\n"}


def test_a_file_moved_out_while_a_like_file_appears_elsewhere_is_still_deleted(tmp_path: Path) -> None:
    # The pairing needs the very same file: one that left the workspace is deleted even when a new
    # directory holds a file of other content or another mtime.
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    watcher, seen = _watch(ws)
    (ws / "notes.txt").write_bytes(b"one\n")
    _drain(watcher)
    (ws / "out").mkdir()
    (ws / "out" / "notes.txt").write_bytes(b"one\n")  # same content, a later mtime
    os.utime(ws / "out" / "notes.txt", ns=(1, 1))
    (ws / "notes.txt").rename(outside / "notes.txt")
    _drain(watcher)
    watcher.finish()
    assert ("delete", "notes.txt") in _facts(seen)
    assert not [f for f in _facts(seen) if f[0] == "rename"]
    assert _replayed(seen) == {"out/notes.txt": b"one\n"}


def test_a_file_written_renamed_and_deleted_within_one_batch_leaves_nothing_behind(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    watcher, seen = _watch(ws)
    (ws / "a.txt").write_bytes(b"one\n")
    (ws / "a.txt").rename(ws / "out" / "renamed.txt")
    (ws / "out" / "renamed.txt").unlink()
    _drain(watcher)
    watcher.finish()
    assert _replayed(seen) == {}
