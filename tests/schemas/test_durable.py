"""schemas.durable: a file holds its old bytes or all of its new ones, and no temporary is left."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from schemas.durable import fsync_dir, open_regular, write_durably


def test_a_durable_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path: Path):
    target = tmp_path / "state.json"
    write_durably(target, b"one")
    write_durably(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["state.json"]
    fsync_dir(tmp_path)  # a directory's names, made durable on their own


def test_a_write_that_cannot_land_keeps_what_was_there(tmp_path: Path):
    target = tmp_path / "taken"
    target.mkdir()  # a rename over a directory fails
    (target / "inside").write_bytes(b"kept")
    with pytest.raises(OSError):
        write_durably(target, b"new")
    assert (target / "inside").read_bytes() == b"kept"
    assert sorted(os.listdir(tmp_path)) == ["taken"]  # the temporary file is gone


def test_open_regular_refuses_at_once_what_is_no_regular_file(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    os.mkfifo(tmp_path / "fifo")  # an open for reading of a FIFO with no writer would block
    (tmp_path / "dir").mkdir()
    os.close(open_regular(tmp_path / "link"))  # a link to a regular file, where links are allowed
    for name, follow, errno_ in [
        ("fifo", True, errno.EINVAL),
        ("dir", True, errno.EINVAL),
        ("link", False, errno.ELOOP),
    ]:
        with pytest.raises(OSError) as e:
            open_regular(tmp_path / name, follow_links=follow)
        assert e.value.errno == errno_, name
