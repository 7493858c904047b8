"""The shim's workspace watcher when it lags behind the agent: real inotify, one batch at a time.

The watcher runs on its own thread and reads inotify's queue every 50 ms; under load many changes
arrive in one batch and are handled after the disk has moved on. These tests make that happen
on purpose (the changes first, then one ``poll``), so what the watcher reports in each case is
exact, not a matter of scheduling.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from recorder.shim import wire
from recorder.shim.watch import Watcher
from recorder.shim.wire import Delete, NoteMsg, Rename, Write


def _watch(ws: Path) -> tuple[Watcher, list[object]]:
    seen: list[object] = []
    return Watcher(str(ws), seen.append, content_cap=1 << 20), seen


def _drain(watcher: Watcher) -> None:
    while watcher.poll(0.0):
        pass


def _facts(seen: list[object]) -> list[tuple]:
    """What a reader of the record learns: each change, in order, without times (names as Python's
    ``os`` functions give them: the wire carries their bytes)."""
    out: list[tuple] = []
    for m in seen:
        if isinstance(m, Write):
            out.append(("write", os.fsdecode(m.path), m.op, m.content))
        elif isinstance(m, Rename):
            out.append(("rename", os.fsdecode(m.src), os.fsdecode(m.dst)))
        elif isinstance(m, Delete):
            out.append(("delete", os.fsdecode(m.path)))
    return out


def _replayed(seen: list[object]) -> dict[str, bytes | None]:
    """The workspace the record describes (path -> content)."""
    files: dict[str, bytes | None] = {}
    for fact in _facts(seen):
        if fact[0] == "write":
            files[fact[1]] = fact[3]
        elif fact[0] == "rename":
            files[fact[2]] = files.pop(fact[1])
        elif fact[0] == "delete":
            files.pop(fact[1], None)
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


def test_names_that_are_not_utf8_are_sent_as_their_bytes(tmp_path: Path) -> None:
    # Linux names are bytes: a file, a directory and a rename whose names are not UTF-8 (one spelled
    # like an escape, one with a backslash), each fact on the wire with the exact bytes of its name.
    ws = tmp_path / "ws"
    ws.mkdir()
    watcher, seen = _watch(ws)
    root = os.fsencode(ws)
    os.mkdir(root + b"/d\xfe")
    with open(root + b"/d\xfe/x\xff", "wb") as f:
        f.write(b"one")
    _drain(watcher)
    with open(root + b"/a\\b \\xff", "wb") as f:
        f.write(b"two")
    _drain(watcher)
    os.rename(root + b"/d\xfe/x\xff", root + b"/y\xc3\x28")
    os.unlink(root + b"/a\\b \\xff")
    _drain(watcher)
    watcher.finish()
    # Each fact through the wire's encoding and back (main: UnicodeEncodeError, the watcher's end).
    on_the_wire = [wire.decode(wire.encode(m)[wire.HEADER.size :]) for m in seen]  # type: ignore[arg-type]
    assert [_named(m) for m in on_the_wire] == [
        ("Write", b"d\xfe/x\xff"),
        ("Write", b"a\\b \\xff"),
        ("Rename", (b"d\xfe/x\xff", b"y\xc3\x28")),
        ("Delete", b"a\\b \\xff"),
    ]
    assert watcher.counts["watch_errors"] == 0


def _named(m: object) -> tuple[str, object]:
    if isinstance(m, Rename):
        return "Rename", (m.src, m.dst)
    assert isinstance(m, Write | Delete)
    return type(m).__name__, m.path


def test_a_change_that_cannot_be_recorded_is_a_note_and_the_watcher_goes_on(tmp_path: Path) -> None:
    # Whatever fails while one change is handled (here: the first send), the watcher's thread lives
    # on: the failure becomes a note naming the change, and what the agent does next is recorded.
    ws = tmp_path / "ws"
    ws.mkdir()
    seen: list[object] = []
    failures = [RuntimeError("the first fact cannot be sent")]

    def emit(msg: object) -> None:
        if failures and isinstance(msg, Write):
            raise failures.pop()
        seen.append(msg)

    watcher = Watcher(str(ws), emit, content_cap=1 << 20)
    watcher.start()
    (ws / "first.txt").write_bytes(b"1")
    (ws / os.fsdecode(b"x\xff")).write_bytes(b"2")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(isinstance(m, Write) for m in seen):
        time.sleep(0.02)
    (ws / "after.txt").write_bytes(b"3")
    watcher.finish()
    notes = [m for m in seen if isinstance(m, NoteMsg)]
    assert len(notes) == 1 and notes[0].names == {"where": b"", "name": b"first.txt"}
    assert "the first fact cannot be sent" in str(notes[0].data["error"])
    assert [f[1] for f in _facts(seen)] == [os.fsdecode(b"x\xff"), "after.txt"]
    assert watcher.counts["watch_errors"] == 1


def test_a_watcher_in_a_process_holding_many_open_files(tmp_path: Path) -> None:
    # Its inotify descriptor is numbered past 1,023, where select() refuses it.
    ws = tmp_path / "ws"
    ws.mkdir()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        watcher, seen = _watch(ws)
        assert watcher.ino.fd > 1023
        (ws / "a.txt").write_bytes(b"one\n")
        _drain(watcher)
        watcher.finish()
    finally:
        for fd in held:
            os.close(fd)
    assert _facts(seen) == [("write", "a.txt", "created", b"one\n")]
