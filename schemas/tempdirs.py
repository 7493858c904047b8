"""amb's entries in the temp dir, each named by a live owner: what may be removed, and when.

Whatever amb makes in the temp dir is named, before it is made, in a lock file of its owner's in
``<tmp>/amb-runs/``: a run's (``recorder.runlock``) or its process's (``make_tempdir``), held with
``flock`` for as long as the owner lives. The kernel drops a dead process's ``flock``, so whoever
finds such a file free knows its owner is gone, even after ``kill -9``, with no stale pid to trust,
and finds in it what to remove (``recorder.gc``; docs/recording.md). amb's other lock files in the
temp dir (``LockFile``) are removed by their last holder, and by ``amb gc`` when nobody holds them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from schemas.errors import AmbError

LOCK_DIR_NAME = "amb-runs"
ENTRY_PREFIX = "amb"
"""What the name of each of amb's entries in the temp dir starts with."""


def lock_dir(tmp: Path | None = None) -> Path:
    """Where the owners' lock files are: ``amb-runs`` in ``tmp`` (default: this process's temp dir)."""
    return Path(tmp or tempfile.gettempdir()) / LOCK_DIR_NAME


def process_start(pid: int) -> str | None:
    """The process's start time (clock ticks since boot; with the pid it names one process), or None
    once it has ended (a zombie waiting for its parent to reap it has ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def process_alive(pid: int, start: str | None) -> bool:
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def process_lock_path(directory: Path, pid: int, start: str | None) -> Path:
    """The lock file of a process's own entries ('@' is in no run id, so it names no run's lock)."""
    return directory / f"proc@{pid}.{start or 0}.lock"


def _shared_dir(directory: Path) -> Path:
    """The lock directory, shared by every user's owners like /tmp itself (mode 1777). A directory
    anyone can create is trusted only if it is a real directory (not a link someone planted) owned
    by root or by us, or sticky like /tmp."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir()
        os.chmod(directory, 0o1777)
    st = os.lstat(directory)
    trusted = stat.S_ISDIR(st.st_mode) and (st.st_uid in (0, os.geteuid()) or st.st_mode & stat.S_ISVTX)
    if not trusted or not os.access(directory, os.W_OK | os.X_OK):
        raise UntrustedLockDir(
            f"{directory} is not a directory amb can trust and write to (a link, or another user's): "
            "remove it, or set TMPDIR to a directory of your own"
        )
    return directory


class UntrustedLockDir(AmbError):
    """Someone else's lock directory: amb makes nothing in the temp dir that it cannot name."""


def remove_if_empty(directory: Path) -> None:
    """The lock directory goes with its last file (whoever makes one next makes it again)."""
    with contextlib.suppress(OSError):  # not empty, gone already, or someone else's
        directory.rmdir()


class OwnerLock:
    """An owner's lock file, naming the temp entries it made; ``release`` at a clean end removes it."""

    def __init__(self, path: Path, info: dict[str, Any]):
        self.path = path
        self.pid = os.getpid()
        self.start = process_start(self.pid)
        self.info: dict[str, Any] = {**info, "pid": self.pid, "start": self.start, "paths": []}
        # Made aside, locked and filled, then renamed into place: nobody sees a lock file that
        # exists but is not held yet. The directory may vanish between its making and the open
        # (its last owner removed it): then it is made again.
        for attempt in range(5):
            aside = _shared_dir(path.parent) / f".{path.name}.{self.pid}.new"
            try:
                self._fd = os.open(
                    aside, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644
                )
                break
            except FileNotFoundError:
                if attempt == 4:
                    raise
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._write()
        os.replace(aside, path)

    def make_tempdir(self, prefix: str) -> Path:
        """A new directory ``<prefix><random>`` in the temp dir, named in this lock before it exists."""
        assert prefix.startswith(ENTRY_PREFIX), prefix
        tmp = self.path.parent.parent
        while True:
            path = tmp / f"{prefix}{secrets.token_hex(4)}"
            self.info["paths"].append(str(path))
            self._write()
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                self.forget(path)

    def forget(self, path: Path) -> None:
        self.info["paths"] = [p for p in self.info["paths"] if p != str(path)]
        self._write()

    def note(self, key: str, value: Any) -> None:
        """Something more whoever cleans up after this owner needs (its backend, its agent's group)."""
        self.info[key] = value
        self._write()

    def _write(self) -> None:
        # Written over the old contents, then cut to length: the file never is empty or half a
        # list, so whoever cleans up after a kill between the two calls still finds every entry
        # (``read_lock_info`` reads the first JSON value and ignores an old tail).
        data = json.dumps(self.info).encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def release(self) -> None:
        """The owner's clean end: what the lock still names is removed, then the file. Should an entry
        resist (a file its owner may not delete), the file stays, free: ``amb gc`` or the next recorder
        finds it and tries again; an entry is never left behind unnamed."""
        if self._fd < 0:
            return
        left = [Path(p) for p in self.info["paths"] if os.path.lexists(p)]
        for p in left:
            remove_tree(p)
        if not any(os.path.lexists(p) for p in left):
            self.path.unlink(missing_ok=True)
            remove_if_empty(self.path.parent)
        self.close()

    def close(self) -> None:
        """Let go of the file descriptor only (a forked child's copy: the parent still holds it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_lock_info(raw: bytes) -> dict[str, Any]:
    """A lock file's JSON object; what follows it (the tail of a longer earlier write, left by a
    kill between writing and cutting) is ignored. Anything else reads as empty."""
    try:
        info, _ = json.JSONDecoder().raw_decode(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def dead_lock(path: Path) -> dict[str, Any] | None:
    """The lock file's contents if its owner is gone (the lock is free), else None. The lock is not
    kept: the caller removes the file once it has cleaned up, and no owner takes a free lock back (a
    process's is named after it; ``RunLock`` refuses a run id whose spool exists)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # alive
        info = read_lock_info(os.pread(fd, 1 << 20, 0))
        info.setdefault("run_id", path.name.removesuffix(".lock"))
        info.setdefault("paths", [])
        return info
    finally:
        os.close(fd)


# ---- a process's own entries --------------------------------------------------------------------

_guard = threading.Lock()
_mine: dict[Path, OwnerLock] = {}
"""This process's lock, by lock directory (a test may point the temp dir elsewhere meanwhile)."""


def make_tempdir(prefix: str, dir: Path | None = None) -> Path:
    """A new directory in the temp dir (or ``dir``), named in this process's lock file: if the process
    is killed before ``remove_tempdir``, ``amb gc`` removes it."""
    directory = lock_dir(dir)
    with _guard:
        owner = _mine.get(directory)
        if owner is None:
            pid = os.getpid()
            path = process_lock_path(directory, pid, process_start(pid))
            owner = _mine[directory] = OwnerLock(path, {"run_id": ""})
        return owner.make_tempdir(prefix)


def remove_tree(path: Path | str) -> None:
    """Remove ``path`` and everything under it, as far as it can be removed (what resists stays:
    callers check). An agent's folders may nest thousands deep, where ``shutil.rmtree`` fails with
    ``RecursionError``: such a tree goes to ``rm -rf``, which walks it level by level."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False)


def remove_tempdir(path: Path) -> None:
    """Remove a directory ``make_tempdir`` made (or any), and its name from this process's lock."""
    remove_tree(path)
    if os.path.lexists(path):
        return  # still named, so that `amb gc` tries again
    with _guard:
        owner = _mine.get(lock_dir(path.parent))
        if owner is None or str(path) not in owner.info["paths"]:
            return
        owner.forget(path)
        if not owner.info["paths"]:
            owner.release()
            del _mine[owner.path.parent]


@contextlib.contextmanager
def tempdir(prefix: str, dir: Path | None = None) -> Iterator[Path]:
    """``make_tempdir``, removed when the block ends."""
    path = make_tempdir(prefix, dir)
    try:
        yield path
    finally:
        remove_tempdir(path)


def _forget_in_child() -> None:
    """A forked child owns nothing of its parent's (which keeps them listed and held)."""
    global _guard
    _guard = threading.Lock()
    for owner in _mine.values():
        owner.close()
    _mine.clear()


os.register_at_fork(after_in_child=_forget_in_child)


# ---- lock files in the temp dir ----------------------------------------------------------------


class NotOurs(Exception):
    """The lock file belongs to another user (who could hold it forever)."""


class LockFile:
    """``path`` (made if missing) held with ``flock`` until ``release``, which removes it.

    Whoever waited for it checks that it still holds the file at ``path``: its last holder (or
    ``amb gc``, when nobody held it) may have removed it meanwhile, and then the new one is taken.
    ``on_wait()`` is called once if another process holds it. Raises ``NotOurs``, or ``OSError``
    when the file cannot be opened (a link is never followed)."""

    def __init__(self, path: Path, on_wait: Callable[[], None] | None = None):
        self.path = path
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                if os.fstat(fd).st_uid != os.geteuid():
                    raise NotOurs(str(path))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if on_wait is not None:
                        on_wait()
                        on_wait = None
                    fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            if _is_at(fd, path):
                self._fd = fd
                return
            os.close(fd)

    def release(self) -> None:
        if self._fd < 0:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def remove_free_lock_file(path: Path) -> bool:
    """Remove the ``LockFile`` at ``path`` if nobody holds it (and it is ours, or we are root)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_uid != os.geteuid() and os.geteuid() != 0:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if not _is_at(fd, path):
            return False
        path.unlink()
        return True
    finally:
        os.close(fd)


def _is_at(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
