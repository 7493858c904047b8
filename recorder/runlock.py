"""Who is still recording: one lock file per live run, held (``flock``) by its amb-record.

A run's resources (containers, networks, firewall rules, temp dirs) carry its run id. The lock
file ``<tmp>/amb-runs/<run_id>.lock`` is held for the recorder's whole life and lists the paths
the run created, so whoever finds it unlocked (``amb gc``, the next amb-record) knows that run's
recorder is gone, even after ``kill -9``, and what to remove. The kernel drops a dead process's
``flock``, so there is no stale pid to trust; resources whose lock file is missing are judged by the
pid and start time of their recorder, which their labels also carry.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

LOCK_DIR_NAME = "amb-runs"


def lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / LOCK_DIR_NAME


def lock_path(run_id: str) -> Path:
    return lock_dir() / f"{run_id}.lock"


def process_start(pid: int) -> str | None:
    """The process's start time (clock ticks since boot; with the pid it names one process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def process_alive(pid: int, start: str | None) -> bool:
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def _shared_dir() -> Path:
    """The lock directory, shared by every user's runs like /tmp itself (mode 1777).

    A directory anyone can create is trusted only if it is a real directory (not a link someone
    planted) owned by root or by us.
    """
    directory = lock_dir()
    try:
        directory.mkdir()
        os.chmod(directory, 0o1777)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()) and not st.st_mode & stat.S_ISVTX:
        raise RuntimeError(f"{directory} is not a directory amb-record can trust (a link, or someone else's)")
    return directory


class RunLock:
    """Held by a live amb-record; ``release`` at the end of a clean run removes the file."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.path = lock_path(run_id)
        directory = _shared_dir()
        if self.path.exists() and dead_lock(self.path) is None:
            raise RuntimeError(f"run {run_id} is being recorded by another amb-record")
        # Made aside, locked and filled, then renamed into place: `amb gc` never sees a lock
        # file that exists but is not held yet.
        aside = directory / f".{run_id}.{os.getpid()}.new"
        self._fd = os.open(aside, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.pid = os.getpid()
        self.start = process_start(self.pid)
        self.info: dict[str, Any] = {"run_id": run_id, "pid": self.pid, "start": self.start, "paths": []}
        self._write()
        os.replace(aside, self.path)

    @property
    def labels(self) -> dict[str, str]:
        """Labels for the run's docker resources."""
        return {
            "org.amb.run": self.run_id,
            "org.amb.lock": str(self.path),
            "org.amb.pid": str(self.pid),
            "org.amb.pid_start": self.start or "",
        }

    def add_path(self, path: Path) -> None:
        """A directory the run created, to be removed if the recorder dies first."""
        self.info["paths"].append(str(path))
        self._write()

    def _write(self) -> None:
        data = json.dumps(self.info).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = -1


def dead_lock(path: Path) -> dict[str, Any] | None:
    """The lock file's contents if its recorder is gone (the lock is free), else None.

    The lock is not kept: the caller removes the file once it has cleaned up, and no recorder can
    take a free lock back (``RunLock`` refuses a run id whose spool already exists).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # alive
        raw = os.pread(fd, 1 << 20, 0)
        try:
            info = json.loads(raw) if raw else {}
        except ValueError:
            info = {}
        info.setdefault("run_id", path.name.removesuffix(".lock"))
        info.setdefault("paths", [])
        return info
    finally:
        os.close(fd)


def owner_alive(labels: dict[str, str]) -> bool:
    """Is the recorder named by a docker resource's labels alive? (Unlabelled: assume so.)"""
    lock = labels.get("org.amb.lock")
    if lock and Path(lock).exists():
        return dead_lock(Path(lock)) is None
    pid = labels.get("org.amb.pid")
    if not pid or not pid.isdigit():
        return True  # made before run locks existed: not ours to judge
    return process_alive(int(pid), labels.get("org.amb.pid_start") or None)
