"""Process tracing without stopping every process: seccomp user notification, plus a light ptrace.

A seccomp filter (``recorder.shim.seccomp``), installed by a launcher (``recorder.shim.launch``)
before it execs the agent, sends ``execve``, ``execveat`` and ``connect`` to the shim; every other
syscall runs untouched. At an exec the shim seizes the caller with ``PTRACE_O_TRACEEXEC`` only: the
exec-event stop confirms the exec and holds the new program while its argv is read; a seized
process's death gives its exit status. Connects are performed by the shim (``recorder.shim.connects``).
docs/containers.md has the details. Needs Linux >= 5.9 on x86_64 or aarch64, the right to install a
filter and, for another uid, CAP_SYS_PTRACE: ``probe`` checks it on a real run, and the shim falls
back to strace where it fails. ``SECCOMP_IOCTL_NOTIF_ID_VALID`` guards every notification against
the caller having died (and its pid been reused) meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import msgspec

from recorder.shim import kernel, launch, seccomp
from recorder.shim.connects import Connector
from recorder.shim.wire import Proc

LABEL = "seccomp-notify"
"""The ``tracer`` name this module's records carry."""

COUNTS = ("notifications", "execs", "connects", "connects_on_reserve", "signals_passed", "tracer_errors")

_FLUSH_AFTER = 0.05
"""Seconds records may wait to be sent together (one wakeup of the receiver per batch)."""


@dataclass
class _Exec:
    """An exec seen at its entry, waiting for the exec-event stop that says it succeeded."""

    tgid: int
    ppid: int
    argv: list[bytes] | None
    """Read at the exec-event stop (or at entry, when the exec cannot be confirmed)."""
    cwd: bytes | None
    ts_ns: int
    unconfirmed: bool = False
    """Not seized (someone else traces it): taken as having succeeded."""


class NotifyTracer:
    """Runs one command under the filter and turns what it does into ``Proc``/``Connect`` messages.

    ``emit`` receives lists of messages (from the tracer's thread and from connect workers).
    ``start`` launches; ``root_done`` is set when the command's own process has ended;
    ``stop`` ends tracing and reports what is still alive as unfinished.
    """

    def __init__(self, emit, *, agent_uid: int | None = None, agent_gid: int | None = None):
        self.emit = emit
        self.uid = -1 if agent_uid is None else agent_uid
        self.gid = self.uid if agent_gid is None else agent_gid
        self.kinds = seccomp.traced()
        self.procs: dict[int, Proc] = {}
        """Processes that exec'd a program and have not ended, by pid."""
        self.pending: dict[int, _Exec] = {}
        """Execs seen at entry, by the calling thread's id."""
        self.seized: set[int] = set()
        self.root_pid: int | None = None
        self.root_status: int | None = None
        """The command's wait status, once it has ended."""
        self.root_done = threading.Event()
        self.failed: str | None = None
        self.last_error: str | None = None
        """The last notification that could not be recorded, and why (the syscall went ahead)."""
        self.counts = dict.fromkeys(COUNTS, 0)
        self._out: list = []
        self._out_lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.listener = kernel.Listener()
        self.connector = Connector(self.listener, self._queue, self._error, self.counts)

    # -- lifecycle (called from the shim's main thread) --

    def start(self, argv: list[str], cwd: str, timeout: float = 30.0, stderr=None) -> None:
        """Launch ``argv`` under the filter; returns once the tracer is ready (or has failed).
        ``stderr`` is the launcher's and the command's (``subprocess.Popen``'s argument)."""
        # SIGCHLD reaches the tracer through a signalfd, so it must be blocked in every thread: the
        # caller blocks it before starting any thread (see ``block_sigchld``).
        self.connector.start()
        self._thread = threading.Thread(
            target=self._main, args=(argv, cwd, stderr), name="amb-shim-notify", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            self.failed = self.failed or "the tracer did not start"
        if self.failed:
            raise OSError(self.failed)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        os.write(self._wake_w, b"x")
        self.connector.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def kill_all(self, sig: int = signal.SIGKILL) -> int:
        """Signal every traced process and every descendant of the command or of a traced one (a
        fork that never exec'd is not traced), the command's own excepted; returns how many."""
        n = 0
        roots = {p for p in (self.root_pid, *list(self.procs)) if p is not None}
        for pid in (kernel.descendants(roots) | set(self.procs)) - {self.root_pid}:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
                n += 1
        return n

    def others_alive(self) -> bool:
        return any(pid != self.root_pid for pid in list(self.procs))

    def _fail_closed(self) -> None:
        """Kill the command and everything traced, and reap the command (on the tracer thread)."""
        for pid in [p for p in (self.root_pid, *list(self.procs)) if p is not None]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.root_status is None and self.root_pid is not None:
            with contextlib.suppress(ChildProcessError):
                _pid, self.root_status = os.waitpid(self.root_pid, kernel.WALL)

    def _main(self, argv: list[str], cwd: str, stderr) -> None:
        sigfd = -1
        try:
            sigfd = kernel.signalfd_for_sigchld()
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            with parent, child:
                # Started from this thread: it is the command's parent and, once seized, its tracer,
                # so this thread alone reaps it (``__WNOTHREAD``) and learns its status.
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",
                        launch.__file__,
                        str(child.fileno()),
                        str(self.uid),
                        str(self.gid),
                        seccomp.program().hex(),
                        *argv,
                    ],
                    cwd=cwd,
                    pass_fds=[child.fileno()],
                    stderr=stderr,
                )
                self.root_pid = proc.pid
                child.close()
                parent.settimeout(30)
                try:
                    _msg, fds, _flags, _addr = socket.recv_fds(parent, 1, 1)
                except OSError as e:  # (a timeout is one)
                    fds = []
                    self.failed = f"the launcher sent no seccomp listener: {e}"
                if not fds and not self.failed:
                    # The launcher ended without installing the filter. If the command could not
                    # be run (it said why on stderr), that is the command's exit, as in a shell.
                    _pid, status = os.waitpid(proc.pid, kernel.WALL)
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    if proc.returncode == launch.COMMAND_NOT_RUN:
                        self.root_status = status
                    else:
                        self.failed = f"the launcher sent no seccomp listener (exit {proc.returncode})"
                elif not fds:
                    self.failed = self.failed or "the launcher sent no seccomp listener"
                else:
                    self.listener.fd = fds[0]
                    self.listener.wake_up_in_sync()
                    parent.sendall(b"K")
        except OSError as e:
            self.failed = f"cannot start the seccomp tracer: {e}"
        self._ready.set()
        if self.root_pid is None or self.root_status is not None:
            if sigfd >= 0:
                os.close(sigfd)
            self.root_done.set()  # nothing was launched, or nothing ran under the filter
            return
        try:
            self._loop(sigfd, proc)
        except Exception as exc:  # noqa: BLE001 - a tracer that cannot go on must not leave the agent unrecorded
            self.failed = f"the seccomp tracer failed: {type(exc).__name__}: {exc}"
            self._fail_closed()
        finally:
            if self.listener.fd >= 0:
                os.close(self.listener.fd)
            os.close(sigfd)
            self._flush(force=True)
            self.root_done.set()

    def _loop(self, sigfd: int, proc: subprocess.Popen) -> None:
        poller = select.poll()
        if self.listener.fd >= 0:
            poller.register(self.listener.fd, select.POLLIN)
        poller.register(sigfd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        self._reap(proc)  # a SIGCHLD may have come before the signalfd was polled
        while not self._stopping.is_set():
            timeout = int(_FLUSH_AFTER * 1000) if self._out else None
            for fd, ev in poller.poll(timeout):
                if fd == self.listener.fd:
                    if ev & select.POLLIN:
                        self._notification()
                    elif ev & (select.POLLHUP | select.POLLERR):
                        poller.unregister(fd)  # no process under the filter is left
                elif fd == sigfd:
                    # SIGCHLDs coalesce: one read clears them all, and any state change after it
                    # raises a new one, so reaping until nothing is left misses nothing.
                    with contextlib.suppress(BlockingIOError):
                        os.read(sigfd, 4096)
                    self._reap(proc)
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 64)
            self._flush()
        self._reap(proc)
        self._finish()

    def _reap(self, proc: subprocess.Popen) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | kernel.WALL | kernel.WNOTHREAD)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if os.WIFSTOPPED(status):
                self._stopped(pid, status)
                continue
            now = time.time_ns()
            if pid == self.root_pid:
                self.root_status = status
                proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            self.seized.discard(pid)
            self.pending.pop(pid, None)  # an exec that never succeeded
            p = self.procs.pop(pid, None)
            if p is not None:
                code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
                sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
                self._queue(_ended(p, now, code, sig))
            if pid == self.root_pid:
                self._flush(force=True)
                self.root_done.set()

    def _stopped(self, pid: int, status: int) -> None:
        sig, event = os.WSTOPSIG(status), status >> 16
        with contextlib.suppress(OSError):  # it died meanwhile; its death is reported next
            if event == kernel.EVENT_EXEC:
                e = None
                try:
                    e = self.pending.pop(pid, None)
                    if e is None:  # exec'd from another thread: the kernel gave it the process's id
                        former = ctypes.c_ulong()
                        kernel.ptrace(kernel.PTRACE_GETEVENTMSG, pid, 0, ctypes.addressof(former))
                        e = self.pending.pop(former.value, None)
                    if e is not None:
                        # Stopped before the new program's first instruction: its argv is exactly
                        # what the kernel copied in, whatever the caller's memory holds now.
                        e.argv = kernel.read_cmdline(pid)
                except Exception as exc:  # noqa: BLE001 - a record lost must not stop the tracer
                    self._error("exec", exc)
                finally:
                    kernel.ptrace(
                        kernel.PTRACE_CONT, pid
                    )  # (the process waits only for this; bookkeeping after)
                if e is not None:
                    self._commit(pid, e)
            elif event == kernel.EVENT_STOP:
                # A group-stop (SIGSTOP and kin) stays a stop until SIGCONT; anything else resumes.
                kernel.ptrace(kernel.PTRACE_LISTEN if sig in kernel.STOP_SIGNALS else kernel.PTRACE_CONT, pid)
            else:  # a signal on its way to the process: deliver it unchanged
                self.counts["signals_passed"] += 1
                kernel.ptrace(kernel.PTRACE_CONT, pid, 0, sig)

    def _commit(self, pid: int, e: _Exec) -> None:
        old = self.procs.get(pid)
        if old is not None:
            # The process replaces its program (a shell exec'ing its last command): the old program
            # ends there, with no exit code of its own.
            self._queue(_ended(old, e.ts_ns))
        self.procs[pid] = Proc(
            pid=pid, ppid=e.ppid, argv=e.argv or [], cwd=e.cwd, start_ns=e.ts_ns, tracer=LABEL
        )
        self.counts["execs"] += 1

    def _notification(self) -> None:
        got = self.listener.receive()
        if got is None:
            return
        nid, tid, nr, arch, args = got
        self.counts["notifications"] += 1
        kind, ptr = self.kinds.get((arch, nr & 0xFFFFFFFF), ("", 8))
        entry = None
        try:
            if kind == "connect":
                if self.connector.take(nid, tid, args):
                    return  # answered by the connect itself
            elif kind:
                entry = self._exec_entry(nid, tid, ptr, args, at=kind == "execveat")
        except Exception as exc:  # noqa: BLE001 - a record lost must not become an agent hung on its syscall
            self._error(kind, exc)
        self.listener.respond(nid, flags=kernel.FLAG_CONTINUE)
        if entry is not None:
            # What exec does not change (parent, cwd) is read while the kernel loads the program.
            try:
                self._exec_details(tid, entry)
            except Exception as exc:  # noqa: BLE001 - likewise
                self._error(kind, exc)

    def _error(self, kind: str, exc: Exception) -> None:
        self.counts["tracer_errors"] += 1
        self.last_error = f"{kind}: {type(exc).__name__}: {exc}"

    def _exec_entry(self, nid: int, tid: int, ptr: int, args: tuple, *, at: bool) -> _Exec | None:
        """While the caller waits: the seize that will report the exec's success (and stop the new
        program before its first instruction, when its argv is read)."""
        if not self.listener.valid(nid):
            return None  # the caller is gone (and its pid may be reused)
        e = _Exec(0, 0, None, None, time.time_ns())
        if tid not in self.seized:
            try:
                kernel.ptrace(kernel.PTRACE_SEIZE, tid, 0, kernel.PTRACE_O_TRACEEXEC)
                self.seized.add(tid)
            except OSError:
                # Traced by someone else (the agent's own strace or gdb): no exec-event stop will
                # come. Read the argv the caller passes now, and take the exec as having succeeded.
                mem = os.open(f"/proc/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    e.argv = kernel.read_argv(mem, args[2] if at else args[1], ptr)
                finally:
                    os.close(mem)
                e.unconfirmed = True
        self.pending[tid] = e
        return e

    def _exec_details(self, tid: int, e: _Exec) -> None:
        e.ppid = kernel.ppid(tid)
        if e.unconfirmed:
            e.tgid = kernel.tgid(tid)
        e.cwd = kernel.cwd(tid)
        if e.unconfirmed and self.pending.get(tid) is e:
            del self.pending[tid]
            self._commit(e.tgid, e)

    def _queue(self, msg) -> None:
        with self._out_lock:
            self._out.append(msg)
        if threading.current_thread() is not self._thread:
            os.write(self._wake_w, b"x")  # let the tracer thread send it with its next batch

    def _flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._out or (not force and now - self._last_flush < _FLUSH_AFTER):
            return
        with self._out_lock:
            out, self._out = self._out, []
        self._last_flush = now
        self.emit(out)

    def _finish(self) -> None:
        """Tracing stops: whatever still runs is reported without an exit code."""
        now = time.time_ns()
        for p in self.procs.values():
            self._queue(_ended(p, now))
        self.procs.clear()
        self._flush(force=True)


def _ended(p: Proc, end_ns: int, exit_code: int | None = None, sig: int | None = None) -> Proc:
    """The record of a program that ended at ``end_ns`` (no exit code: replaced by an exec, or still
    running when tracing stopped)."""
    return msgspec.structs.replace(p, end_ns=end_ns, exit_code=exit_code, signal=sig)


def block_sigchld() -> None:
    """Block SIGCHLD in this thread and every thread started after (the tracer reads it from a
    signalfd). The launcher unblocks it before exec'ing the agent."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})


def unblock_sigchld() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def probe(agent_uid: int | None = None, agent_gid: int | None = None) -> tuple[bool, str]:
    """Can this tracer work here? Runs a small command under it and checks the record."""
    if platform.machine() not in seccomp.SYSCALLS:
        return False, f"seccomp notification tracing is not built for {platform.machine()}"
    if shutil.which("sh") is None:
        return False, "no sh to probe with"
    got: list = []
    tracer = NotifyTracer(got.extend, agent_uid=agent_uid, agent_gid=agent_gid)
    with tempfile.TemporaryFile() as err:  # the launcher's complaint, if any, goes into the reason
        try:
            tracer.start(["sh", "-c", "/bin/true; exit 3"], "/", stderr=err)
        except OSError as e:
            tracer.stop()
            err.seek(0)
            said = err.read().decode(errors="replace").strip().removeprefix("amb-shim: ")
            return False, f"{e}: {said}" if said else str(e)
        tracer.root_done.wait(20)
        tracer.stop()
    procs = [m for m in got if isinstance(m, Proc)]
    seen = sorted((p.argv, p.exit_code) for p in procs)
    if seen != [([b"/bin/true"], 0), ([b"sh", b"-c", b"/bin/true; exit 3"], 3)]:
        why = f" ({tracer.last_error})" if tracer.last_error else f": {seen}"
        return False, f"seccomp notification tracing did not record a test command correctly{why}"
    return True, ""
