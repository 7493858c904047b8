"""Imported names are recorded as OS strings are (``schemas.ostext``): a foreign text is the name of
its UTF-8 bytes, so a backslash in an imported command or path is recorded doubled and reads back as
the one backslash it was (not as an escape of a byte)."""

from __future__ import annotations

from types import SimpleNamespace

from recorder.importers.inspect_eval import _sandbox
from schemas.events import FileAccessed, ProcessExited
from schemas.ostext import os_bytes


def test_an_inspect_command_and_path_keep_their_backslashes() -> None:
    run = SimpleNamespace(
        action="exec", cmd=r"bash -c 'printf a\\xff > /da\ta'", output="", result=0, completed=None
    )
    # No output: nothing for a run builder to store; it only names the input in messages.
    builder = SimpleNamespace(origin="log.eval")
    ((_, proc),) = _sandbox(builder, run, 1)  # type: ignore[arg-type]
    assert isinstance(proc, ProcessExited)
    assert [os_bytes(a) for a in proc.argv] == [b"bash", b"-c", rb"printf a\\xff > /da\ta"]
    read = SimpleNamespace(action="read_file", file=r"C:\data\x41.txt", completed=None)
    ((_, acc),) = _sandbox(builder, read, 1)  # type: ignore[arg-type]
    assert isinstance(acc, FileAccessed) and os_bytes(acc.path) == rb"C:\data\x41.txt"
