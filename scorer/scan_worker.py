"""Python scanners run in a worker process, so that one which hangs can be stopped (docs/scanning.md).

Python cannot kill a thread, so each of the scan's jobs has its own worker process (``python -m
scorer.scan_worker``) that imports the scanner files itself and is sent typed ``Trajectory`` values
as msgpack; past a scanner's timeout the parent kills the worker's process group and starts a new
one. The worker never opens the store, and dies with its parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import msgspec

from schemas.display import relay
from schemas.errors import AmbError
from schemas.fdwait import readable
from schemas.finding import Finding
from scorer.scanners import Scanner, findings, load
from scorer.trajectory import Trajectory

_HEADER = struct.Struct(">I")
STARTUP_S = 120.0
"""How long a new worker may take to import the scanner files (not part of any scanner's timeout)."""


class Init(msgspec.Struct):
    scanners: list[tuple[str, str, str]]
    """(file, function name, expected id) of each scanner the worker runs."""


class Job(msgspec.Struct):
    traj: Trajectory
    calls: list[int]
    """Indexes into ``Init.scanners``, called in this order."""


class Reply(msgspec.Struct):
    found: list[Finding] = []
    error: str | None = None


class _Stopped(Exception):
    """The worker ran past a deadline, or ended: it is no longer usable."""


class Worker:
    """One worker process and the scanners it was started with (``scanners``: file, name, id)."""

    def __init__(self, scanners: list[tuple[str, str, str]]):
        self.proc = subprocess.Popen(
            # -P: the current directory is not put on the path, so no folder of the user's there
            # can stand in for this project's modules.
            [sys.executable, "-P", "-m", "scorer.scan_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a kill reaches what the scanner started
        )
        self._relay = threading.Thread(target=_relay, args=(self.proc.stderr,), daemon=True)
        self._relay.start()
        self._buf = bytearray()
        try:
            self._send(Init(scanners))
            self.ready = self._recv(STARTUP_S)
        except _Stopped as e:
            self.ready = Reply(error=f"the scanner's worker process did not start: {e}")
            self.kill()

    def _send(self, msg: msgspec.Struct) -> None:
        try:
            body = msgspec.msgpack.encode(msg)
        except UnicodeEncodeError:  # an agent's JSON escaped a lone surrogate: sent as the view shows it
            body = msgspec.msgpack.encode(_escaped(msgspec.to_builtins(msg, builtin_types=(bytes,))))
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(_HEADER.pack(len(body)) + body)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise _Stopped(self._ended()) from e

    def _read(self, n: int, deadline: float, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not readable(fd, left):
                raise _Stopped(f"timeout: still running after {timeout:g} s (its worker process was killed)")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise _Stopped(self._ended())
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _recv(self, timeout: float) -> Reply:
        deadline = time.monotonic() + timeout
        (n,) = _HEADER.unpack(self._read(_HEADER.size, deadline, timeout))
        return msgspec.msgpack.decode(self._read(n, deadline, timeout), type=Reply)

    def _ended(self) -> str:
        code = self.proc.wait()
        return f"the scanner's worker process ended (exit code {code}) while scanning this run"

    def call(
        self, traj: Trajectory, calls: list[int], timeouts: list[float]
    ) -> tuple[list[Reply], str | None]:
        """The replies to ``calls`` in order, up to the first that fails: then also why it failed
        (a timeout, the worker's death), after which this worker is no longer usable."""
        out: list[Reply] = []
        try:
            self._send(Job(traj, calls))
            for t in timeouts:
                out.append(self._recv(t))
        except _Stopped as e:
            return out, str(e)
        return out, None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._close_pipes()

    def close(self) -> None:
        """End an idle worker: closing its input is its signal to exit."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        self._relay.join(timeout=10)  # what the worker printed last, before the scan's own lines
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):  # a pipe to a killed worker may fail to flush
                    pipe.close()


def _relay(stream: Any) -> None:
    """What a worker prints (its scanners' prints, a traceback), line by line to this process's
    stderr, escaped (``relay``): a scanner may print the agent's text."""
    with stream:
        relay(stream, sys.stderr)


def _escaped(value: Any) -> Any:
    """``value`` (builtins) with each lone surrogate in its text written as a ``\\udXXX`` escape."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    return value


class Workers:
    """The Python scanners of one scan, run in one worker process per scanning thread."""

    def __init__(self, scanners: list[Scanner]):
        self.index = {s.id: i for i, s in enumerate(scanners)}
        self.specs = [(s.path or "", s.name, s.id) for s in scanners]
        self.local = threading.local()
        self.started: list[Worker] = []
        self.lock = threading.Lock()

    def _worker(self) -> Worker:
        worker = getattr(self.local, "worker", None)
        if worker is None:
            worker = self.local.worker = Worker(self.specs)
            with self.lock:
                self.started.append(worker)
        return worker

    def run(self, traj: Trajectory, scanners: list[Scanner]) -> list[Reply]:
        """One reply per scanner, in order: its findings or its error. A call that times out or
        ends the worker is that call's error, and the rest go to a new worker."""
        out: list[Reply] = []
        while len(out) < len(scanners):
            worker = self._worker()
            if worker.ready.error is not None:
                return out + [worker.ready] * (len(scanners) - len(out))
            todo = scanners[len(out) :]
            got, stopped = worker.call(traj, [self.index[s.id] for s in todo], [s.timeout_s for s in todo])
            out += got
            if stopped is not None:
                out.append(Reply(error=stopped))
                worker.kill()
                self.local.worker = None
        return out

    def close(self) -> None:
        with self.lock:
            for w in self.started:
                if w.proc.returncode is None:
                    w.close()


# The worker's side.


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


def _read_exact(stream: Any, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data and len(data) == n else None


def _load(specs: list[tuple[str, str, str]]) -> tuple[list[Any], str | None]:
    fns: list[Any] = []
    try:
        loaded: dict[str, dict[str, Any]] = {}
        for path, name, sid in specs:
            if path not in loaded:
                loaded[path] = {s.name: s for s in load(path)}
            s = loaded[path].get(name)
            if s is None or s.id != sid:
                return [], f"scanner {name} in {path} changed since the scan started: scan again"
            fns.append(s.fn)
    except AmbError as e:
        return [], str(e)
    return fns, None


def _call(fn: Any, traj: Trajectory) -> Reply:
    try:
        return Reply(found=findings(fn(traj), None))
    except BaseException as e:  # the user's code: whatever it raises is that run's error
        return Reply(error=f"{type(e).__name__}: {_said(e)}")


def _said(e: BaseException) -> str:
    """What an exception says, at most 500 characters; what went wrong when it cannot say (its own
    ``__str__`` raises)."""
    try:
        return str(e)[:500]
    except BaseException as inner:  # the user's __str__: whatever it raises
        return f"(its message cannot be shown: its __str__ raised {type(inner).__name__})"


def main() -> None:
    _die_with_parent()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what a scanner prints goes to stderr, never into the replies
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    sys.stdin = open(os.devnull)  # noqa: SIM115 - a scanner that reads input gets nothing

    def reply(r: Reply) -> None:
        body = msgspec.msgpack.encode(r)
        out.write(_HEADER.pack(len(body)) + body)
        out.flush()

    frames = msgspec.msgpack.Decoder(Init), msgspec.msgpack.Decoder(Job)
    header = _read_exact(stdin, _HEADER.size)
    if header is None:
        return
    body = _read_exact(stdin, _HEADER.unpack(header)[0]) or b""
    fns, error = _load(frames[0].decode(body).scanners)
    reply(Reply(error=error))
    while (header := _read_exact(stdin, _HEADER.size)) is not None:
        job = frames[1].decode(_read_exact(stdin, _HEADER.unpack(header)[0]) or b"")
        for i in job.calls:
            reply(_call(fns[i], job.traj))


if __name__ == "__main__":
    main()
