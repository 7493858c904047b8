"""Who is still recording: one lock file per live run, ``<tmp>/amb-runs/<run_id>.lock``, held
(``flock``) by its amb-record for its whole life and naming the temp dirs the run made. The kernel
drops a dead process's ``flock``, so whoever finds the file unlocked (``amb gc``, the next
amb-record, the watchdog) knows the recorder is gone, even after ``kill -9``. Resources whose lock
file is missing are judged by their recorder's pid and start time, which their labels carry
(docs/recording.md; the mechanism is ``schemas.tempdirs``'s).
"""

from __future__ import annotations

from pathlib import Path

from schemas.tempdirs import OwnerLock, dead_lock, lock_dir, process_alive


def lock_path(run_id: str) -> Path:
    return lock_dir() / f"{run_id}.lock"


class StaleRunLock(RuntimeError):
    """The run id's lock file is left by a recorder that is gone (``path``), with what it names."""

    def __init__(self, path: Path):
        super().__init__(
            f"a recorder of this run id that is gone left {path} and what it names: run `amb gc`"
        )
        self.path = path


class RunLock(OwnerLock):
    """Held by a live amb-record; ``release`` at the end of a clean run removes the file."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        path = lock_path(run_id)
        if path.exists():
            if dead_lock(path) is None:
                raise RuntimeError(f"run {run_id} is being recorded by another amb-record")
            # Taking it over would lose what it names: whoever cleans up does that first.
            raise StaleRunLock(path)
        super().__init__(path, {"run_id": run_id})

    @property
    def labels(self) -> dict[str, str]:
        """Labels for the run's docker resources."""
        return {
            "org.amb.run": self.run_id,
            "org.amb.lock": str(self.path),
            "org.amb.pid": str(self.pid),
            "org.amb.pid_start": self.start or "",
        }


def owner_alive(labels: dict[str, str]) -> bool:
    """Is the recorder named by a docker resource's labels alive? (Unlabelled: assume so.)"""
    lock = labels.get("org.amb.lock")
    if lock and Path(lock).exists():
        return dead_lock(Path(lock)) is None
    pid = labels.get("org.amb.pid")
    if not pid or not pid.isdigit():
        return True  # made before run locks existed: not ours to judge
    return process_alive(int(pid), labels.get("org.amb.pid_start") or None)
