"""The fallback process observer, for where ptrace is not permitted: poll ``/proc``.

Clearly weaker than tracing, and labelled so in every record (``tracer="proc-poll"``): a process
that lives shorter than the poll interval may be missed, exit codes are known only for the root
process, and end times are accurate to one interval. It watches the root process's descendants.
"""

from __future__ import annotations

import os
import threading
import time

from recorder.shim import kernel
from recorder.shim.wire import Proc

_CLK = os.sysconf("SC_CLK_TCK")


def _boot_ns() -> int:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1]) * 1_000_000_000
    return 0


class ProcPoller:
    def __init__(self, root_pid: int, emit, *, interval: float = 0.02):
        self.root_pid = root_pid
        self.emit = emit
        self.interval = interval
        self.alive: dict[int, Proc] = {}
        self.boot_ns = _boot_ns()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="amb-shim-procpoll", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _snapshot(self) -> dict[int, tuple[int, list[bytes], int]]:
        """pid -> (ppid, argv, start_ns) for the root and every process under it."""
        table: dict[int, tuple[int, list[bytes], int]] = {}
        for pid in {self.root_pid} | kernel.descendants({self.root_pid}):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
                argv = kernel.read_cmdline(pid)
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            start_ns = self.boot_ns + int(fields[19]) * 1_000_000_000 // _CLK
            table[pid] = (int(fields[1]), argv, start_ns)
        return table

    def poll_once(self) -> None:
        now = time.time_ns()
        snap = self._snapshot()
        for pid, (ppid, argv, start_ns) in snap.items():
            old = self.alive.get(pid)
            if old is None or (argv and old.argv != argv):
                self.alive[pid] = Proc(
                    pid=pid, ppid=ppid, argv=argv, cwd=kernel.cwd(pid), start_ns=start_ns, tracer="proc-poll"
                )
        for pid in [p for p in self.alive if p not in snap and p != self.root_pid]:
            rec = self.alive.pop(pid)
            rec.end_ns = now
            self.emit(rec)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

    def finish(self, root_exit: int | None, root_signal: int | None) -> None:
        self._stop.set()
        self._thread.join()
        now = time.time_ns()
        for pid, rec in self.alive.items():
            rec.end_ns = now
            if pid == self.root_pid:
                rec.exit_code = root_exit
                rec.signal = root_signal
            self.emit(rec)
        self.alive.clear()
