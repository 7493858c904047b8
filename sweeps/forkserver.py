"""A warm ``amb sweep exec``: one process that imports the exec's code once and forks a child per spec.

A cold exec spends seconds of a busy machine starting an interpreter and importing amb, the
recorder and mitmproxy. The local executor starts ``amb sweep exec --serve`` once per sweep
(``ExecServer`` is its client): it imports what a run needs, then reads requests on stdin and
answers on stdout, one JSON object a line:

- in: ``{"spec": "/abs/spec.json", "log": "/abs/log", "env": {...}}`` (``env``: added to the
  child's environment); out: ``{"spec": ..., "pid": N}`` once the child is forked;
- out: ``{"pid": N, "exit": CODE}`` when a child has exited (its exit status, as the cold command's);
- out first: ``{"ready": PID}`` once the imports are done.

Each child is exactly the cold command's execution (:func:`sweeps.exec.execute`, the same error
lines and exit statuses) in its own session, with its output in its log, and SIGTERM as its
parent-death signal; the server has SIGTERM as its own (set by the executor), so a sweep killed
outright still stops every run's container. Closing stdin ends the server once its children have
exited. The server forks from one thread only and holds no threads of its own, so a child starts
with nothing half-locked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from schemas.fdwait import readable
from sweeps.executor import exec_command
from sweeps.standin import STOP_SIGNALS, term_with_parent

WAIT_S = 0.05
"""How often the server looks for exited children while no request arrives."""
START_S = 300.0
"""How long a client waits for the server to be ready (its imports; a loaded machine is slow)."""


def preload() -> None:
    """Import what every run imports, so that a forked child has it already."""
    import agents.baseline.server  # noqa: F401 - imported for its side effect: loaded before fork
    import recorder.local_backend  # noqa: F401
    import recorder.proxy.custody  # noqa: F401
    import recorder.proxy.server  # noqa: F401
    import recorder.proxy.sink  # noqa: F401
    import sweeps.exec  # noqa: F401
    import tasks.registry  # noqa: F401


STOP_WAIT_S = 60.0
"""After a stop signal, how long the server waits for its children to stop their containers."""


def serve(stdin: int = 0, stdout: int = 1) -> int:
    """Serve requests until stdin closes and every child has exited; returns the exit status.

    A stop signal (or its parent's death: the server may have inherited a stop signal ignored or
    blocked from the engine's worker, so it also watches its parent) is passed on to every child,
    each of which stops its own container; the server then waits for them and exits."""
    preload()
    if threading.active_count() != 1:
        # A thread started by an import would be missing (and its locks possibly held) in each child.
        print(f"amb sweep exec --serve: {threading.active_count()} threads after imports", file=sys.stderr)
        return 1
    out = os.fdopen(stdout, "w", buffering=1, closefd=False)
    children: set[int] = set()
    stopping: list[float] = []

    def stop(_signum: int, _frame: object) -> None:
        if not stopping:
            stopping.append(time.monotonic())
            _signal_all(children, signal.SIGTERM)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    parent = os.getppid()
    _say(out, {"ready": os.getpid()})
    pending = b""
    open_input = True
    while (open_input and not stopping) or children:
        if os.getppid() != parent:
            stop(signal.SIGTERM, None)
        if stopping and time.monotonic() - stopping[0] > STOP_WAIT_S:
            _signal_all(children, signal.SIGKILL)
        ready = False
        if open_input and not stopping:
            ready = readable(stdin, WAIT_S)
        else:
            time.sleep(WAIT_S)
        _reap(out, children)
        if not ready:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            open_input = False
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip() and not stopping:
                request = json.loads(line)
                pid = _fork(request["spec"], request["log"], request.get("env") or {}, stdin, stdout)
                children.add(pid)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
                _say(out, {"spec": request["spec"], "pid": pid})
    return 128 + signal.SIGTERM if stopping else 0


def _signal_all(children: set[int], sig: int) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)  # each child leads its own session


def _say(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _reap(out: Any, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        _say(out, {"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


def _fork(spec_file: str, log_file: str, env: dict[str, str], stdin: int, stdout: int) -> int:
    server = os.getpid()
    # Stop signals wait until the child has let go of the server's handler (which signals the
    # server's children) and the parent has the child's pid.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pid = os.fork()
    if pid:
        return pid  # the caller unblocks them once the pid is among its children
    code = 1
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)  # the exec installs its own handlers
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        os.setsid()
        term_with_parent()
        if os.getppid() != server:  # the server died before the parent-death signal was set
            raise SystemExit(f"amb sweep exec --serve: the server ({server}) is gone")
        # The server's pipes become /dev/null and the run's log (dup2 replaces each in one step).
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in {null, log, stdin, stdout} - {0, 1, 2}:
            os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        sys.argv = ["amb", "sweep", "exec", spec_file]
        os.environ.update(env)
        code = run_exec(Path(spec_file))
    except BaseException:  # whatever happens, this child must never return into the server's loop
        traceback.print_exc()
    finally:
        _exit(code)
    raise AssertionError("unreachable")  # _exit does not return


def run_exec(spec_file: Path) -> int:
    """What ``amb sweep exec SPEC.json`` does, with its error line and exit status for amb's errors."""
    from schemas.errors import AmbError
    from sweeps.exec import execute

    try:
        return execute(spec_file)
    except AmbError as e:
        print(f"amb: error: {e}", file=sys.stderr)
        return e.exit_code


def _exit(code: int) -> None:
    """End the child as an interpreter's exit would (other threads joined, exit handlers run), but
    without unwinding into the server's frames."""
    import atexit

    try:
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


class ExecServer:
    """``amb sweep exec --serve`` (``sweeps.forkserver``), seen from the executor."""

    def __init__(self, log_file: Path):
        self.t0 = time.monotonic()
        with open(log_file, "ab") as log:
            self.proc = subprocess.Popen(
                [*exec_command(Path("-"))[:-1], "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                preexec_fn=term_with_parent,
            )
        self._buf = b""
        self.ready = False
        self.exits: dict[int, int] = {}
        self.started: dict[str, int] = {}

    def wait_ready(self) -> float | None:
        """Seconds the server took to be ready; None if it was not within ``START_S`` (or died)."""
        deadline = time.monotonic() + START_S
        while not self.ready and self.pump(deadline - time.monotonic()):
            pass
        return time.monotonic() - self.t0 if self.ready else None

    def start(self, spec: Path, log_path: Path, env: dict[str, str] | None = None) -> int | None:
        """Ask for a child executing ``spec`` (with ``env`` added to its environment); its pid
        (None: the server does not answer)."""
        key = str(spec.resolve())
        request = {"spec": key, "log": str(log_path.resolve()), "env": env or {}}
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        deadline = time.monotonic() + 30
        while key not in self.started and self.pump(deadline - time.monotonic()):
            pass
        return self.started.pop(key, None)

    def pump(self, timeout: float = 0.0) -> bool:
        """Read what the server said within ``timeout``; False once it is gone or the time is up."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        if not readable(fd, timeout):
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "ready" in message:
                self.ready = True
            elif "exit" in message:
                self.exits[message["pid"]] = message["exit"]
            elif "spec" in message:
                self.started[message["spec"]] = message["pid"]
        return True

    def close(self) -> None:
        """No more specs: the server exits once its children have."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self.proc.poll() is None and not self.ready:
            self.proc.kill()  # never got going (a failed start): nothing of it to wait for
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)  # at once when its children are done; else they go on, and so does it


class Forked:
    """One exec forked by the server, with the part of ``subprocess.Popen`` the executor uses."""

    def __init__(self, server: ExecServer, pid: int):
        self.server = server
        self.pid = pid

    def poll(self) -> int | None:
        while self.server.pump(0):
            pass
        if self.pid not in self.server.exits and self.server.proc.poll() is not None:
            return -signal.SIGKILL  # the server is gone, so is its child (parent-death signal)
        return self.server.exits.get(self.pid)

    def wait(self, timeout: float | None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"exec {self.pid}", timeout or 0.0)
            self.server.pump(min(0.1, deadline - time.monotonic()))
        return code
