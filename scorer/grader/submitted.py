"""Opening a submitted file: only a regular file that really lives inside the submission folder.

A submission is hostile, so a file is reached one name at a time with ``openat`` and ``O_NOFOLLOW``
and its descriptor checked with ``fstat`` (no symbolic or hard link, nothing but a regular file, the
inode checked); docs/tasks-and-grader.md lists the refusals. The folder itself is the one the caller
named. ``Rejected`` carries the reason a case gets; ``kind`` is ``missing`` or ``invalid``.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Rejected(Exception):
    """A submitted path the grader will not read; the message is the case's reason."""

    def __init__(self, reason: str, kind: str = "invalid") -> None:
        super().__init__(reason)
        self.kind = kind
        """``missing`` (nothing there) or ``invalid`` (something there the grader refuses)."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_LINK = "a symbolic link: the grader reads only regular files inside the submission"


def _what(mode: int) -> str:
    return next((name for is_kind, name in _KINDS if is_kind(mode)), "not a regular file")


def _parts(rel: str | PurePosixPath) -> list[str]:
    parts = [p for p in PurePosixPath(rel).parts if p not in ("", ".")]
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
        raise ValueError(f"submitted path {rel!s} must be relative and stay inside the submission")
    return parts


def _refuse(st: os.stat_result, link_reason: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise Rejected(link_reason)
    if not stat.S_ISREG(st.st_mode):
        raise Rejected(f"not a regular file ({_what(st.st_mode)})")
    if st.st_nlink > 1:
        raise Rejected(
            f"a hard link ({st.st_nlink} names for one file): the grader reads only files that are "
            "not linked elsewhere"
        )


def open_submitted(submission: Path, rel: str | PurePosixPath) -> BinaryIO:
    """The submitted file ``submission/rel`` opened for binary reading, or ``Rejected`` saying why."""
    parts = _parts(rel)
    fd = os.open(submission, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise Rejected("missing", "missing") from None
            if stat.S_ISLNK(st.st_mode):
                shown = "/".join(parts[: i + 1])
                raise Rejected(f"{shown}/ is a symbolic link: the grader does not follow links")
            if not stat.S_ISDIR(st.st_mode):
                raise Rejected("missing", "missing")  # a file where a folder should be: nothing here
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise Rejected(f"cannot open {'/'.join(parts[: i + 1])}/: {e.strerror}") from None
            os.close(fd)
            fd = sub
            if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (st.st_dev, st.st_ino):
                raise Rejected(f"{'/'.join(parts[: i + 1])}/ changed while it was being opened")
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise Rejected("missing", "missing") from None
        _refuse(st, _LINK)
        try:
            file_fd = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Rejected(_LINK) from None
            raise Rejected(f"cannot open: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        opened = os.fstat(file_fd)
        _refuse(opened, "a symbolic link")
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise Rejected("changed while it was being opened")
        os.set_blocking(file_fd, True)
        return os.fdopen(file_fd, "rb")
    except BaseException:
        os.close(file_fd)
        raise
