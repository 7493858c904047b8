"""A warm ``amb sweep exec``: one process that imports the exec's code once and forks a child per spec.

A cold ``amb sweep exec`` spends most of its own time (besides the run) starting an interpreter and
importing amb, the recorder and mitmproxy; on a busy machine that is seconds per run. The local
executor instead starts ``amb sweep exec --serve`` once per sweep: it imports everything a run needs
(:func:`preload`), then reads requests on stdin and answers on stdout, one JSON object a line:

- in: ``{"spec": "/abs/spec.json", "log": "/abs/log"}``; out: ``{"spec": ..., "pid": N}`` once the
  child is forked;
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

import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

WAIT_S = 0.05
"""How often the server looks for exited children while no request arrives."""


def preload() -> None:
    """Import what every run imports (the exec, the recorder, the proxy and mitmproxy, the local
    backend, the baseline server, the task registry), so that a forked child has it already."""
    import agents.baseline.server  # noqa: F401 - imported for its side effect: loaded before fork
    import recorder.local_backend  # noqa: F401
    import recorder.proxy.custody  # noqa: F401
    import recorder.proxy.server  # noqa: F401
    import recorder.proxy.sink  # noqa: F401
    import sweeps.exec  # noqa: F401
    import tasks.registry  # noqa: F401


def serve(stdin: int = 0, stdout: int = 1) -> int:
    """Serve requests until stdin closes and every child has exited; returns the exit status."""
    preload()
    if threading.active_count() != 1:
        # A thread started by an import would be missing (and its locks possibly held) in each child.
        print(f"amb sweep exec --serve: {threading.active_count()} threads after imports", file=sys.stderr)
        return 1
    out = os.fdopen(stdout, "w", buffering=1, closefd=False)
    _say(out, {"ready": os.getpid()})
    children: set[int] = set()
    pending = b""
    open_input = True
    while open_input or children:
        readable: list[int] = []
        if open_input:
            readable, _, _ = select.select([stdin], [], [], WAIT_S)
        else:
            time.sleep(WAIT_S)
        _reap(out, children)
        if not readable:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            open_input = False
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                request = json.loads(line)
                pid = _fork(request["spec"], request["log"], stdin, stdout)
                children.add(pid)
                _say(out, {"spec": request["spec"], "pid": pid})
    return 0


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


def _fork(spec_file: str, log_file: str, stdin: int, stdout: int) -> int:
    server = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        _term_with_parent()
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


def _term_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
