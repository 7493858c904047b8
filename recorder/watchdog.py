"""A recorder's watchdog: when amb-record dies without closing its run (``kill -9``, the OOM killer),
it removes what the run left within seconds (docs/recording.md, "What a killed recorder leaves").

It runs in a session of its own, its stdin a pipe whose only write end amb-record holds: a clean end
writes ``release``; end of file without it means amb-record is gone, and once it has ended the
watchdog kills what is left of a local agent's process group and removes what the run's lock and
amb-record's process lock name (``recorder.gc``). Run as
``python -m recorder.watchdog --lock RUNLOCK --pid PID --start START``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from recorder.runlock import RunLock
from schemas.tempdirs import dead_lock, process_alive, process_lock_path

RELEASE = b"release"
POLL_S = 0.05


class Watchdog:
    """amb-record's end of the pipe, and the watchdog process."""

    def __init__(self, proc: subprocess.Popen[bytes], pipe: int):
        self.proc = proc
        self._pipe = pipe

    @classmethod
    def start(cls, lock: RunLock) -> Watchdog:
        """Raises ``OSError`` if it cannot be started."""
        read, write = os.pipe()  # both close on exec: only the watchdog gets the read end, as stdin
        argv = [sys.executable, "-P", "-m", "recorder.watchdog"]
        argv += ["--lock", str(lock.path), "--pid", str(lock.pid), "--start", lock.start or ""]
        try:
            # cwd /: it pins no directory of the run's; -P: nothing is imported from it either.
            proc = subprocess.Popen(
                argv, stdin=read, stdout=subprocess.DEVNULL, cwd="/", start_new_session=True
            )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        lock.note("watchdog", proc.pid)
        return cls(proc, write)

    def release(self) -> None:
        """The run was closed: the watchdog exits without touching anything."""
        if self._pipe < 0:
            return
        try:
            os.write(self._pipe, RELEASE)
        except BrokenPipeError:
            pass  # it was killed: there is nothing to tell
        finally:
            os.close(self._pipe)
            self._pipe = -1
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def watch(lock: Path, pid: int, start: str | None) -> list[str]:
    """Wait for the recorder's end; if it did not release the run, clean up after it. Returns what
    was removed, as ``kind name`` lines (empty after a release)."""
    said = b""
    while chunk := os.read(0, 64):
        said += chunk
    if said == RELEASE:
        return []
    while process_alive(pid, start):  # end of file comes as it dies; its locks are freed with it
        time.sleep(POLL_S)
    from recorder.gc import collect

    info = dead_lock(lock) or {}
    killed = _kill_group(info.get("agent"))
    removed, problems = collect(
        docker=None, everywhere=False, locks=[lock, process_lock_path(lock.parent, pid, start)]
    )
    return killed + [f"{r.kind} {r.name}" for r in removed] + [f"problem: {p}" for p in problems]


def _kill_group(agent: object) -> list[str]:
    """SIGKILL to what is left of a local agent's process group. Its leader died with the recorder
    moments ago and the group's other members keep its id taken, so the id names no one else."""
    if not isinstance(agent, dict) or not isinstance(agent.get("pgid"), int) or agent["pgid"] <= 1:
        return []
    try:
        os.killpg(agent["pgid"], signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return []
    return [f"process_group {agent['pgid']}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="amb-record watchdog")
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--start", default="")
    args = parser.parse_args(argv)
    # A signal meant for amb-record's terminal does not end the watch (the group kill it is for).
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    done = watch(args.lock, args.pid, args.start or None)
    if done:
        run_id = args.lock.name.removesuffix(".lock")
        with contextlib.suppress(OSError):  # nobody is reading any more
            print(
                f"amb-record: watchdog: run {run_id}'s amb-record is gone; removed {', '.join(done)}",
                file=sys.stderr,
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
