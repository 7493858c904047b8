"""Process tracing without stopping every process: seccomp user notification, plus a light ptrace.

strace follows every fork and stops each new process several times; on a workload of many short
processes that alone costs ~6% of wall time on a 2-core machine. This tracer stops a process only
where there is something to record:

- A seccomp filter, installed by a small launcher before it execs the agent and inherited by all
  its descendants, sends ``execve``, ``execveat`` and ``connect`` to the shim as notifications
  (``SECCOMP_RET_USER_NOTIF``). Every other syscall, fork included, runs untouched. (The filter
  program itself is ``recorder.shim.seccomp``.)
- On an exec the shim attaches to the caller with ``PTRACE_SEIZE`` and only
  ``PTRACE_O_TRACEEXEC`` (unless it already has). The exec-event stop says the exec succeeded
  (``execvp`` tries every ``PATH`` entry; only the one that worked is a program that ran) and
  holds the new program before its first instruction, when its argv is read from
  ``/proc/<pid>/cmdline``: exactly what the kernel copied in. Its parent and cwd come from
  ``/proc`` too. When a seized process dies, the tracer learns its exit status, code or signal.
  A seized process also stops for each signal delivered to it (a shell's ``SIGCHLD``), which is
  passed straight on.
- A ``connect`` to an IPv4 or IPv6 address is performed by the shim on the caller's own socket
  (a duplicate from ``pidfd_getfd``: the same open socket, same flags, same namespace), and its
  result is returned as the syscall's: so the record has the outcome as well as the address.

Needs: Linux >= 5.9 (pidfd_getfd, ``SECCOMP_USER_NOTIF_FLAG_CONTINUE``), x86_64 or aarch64, the
right to install a filter (no_new_privs, which the container sets, or CAP_SYS_ADMIN), and
CAP_SYS_PTRACE when the agent runs under another uid. ``probe`` checks all of it on a real run;
the shim falls back to strace where it fails.

``SECCOMP_IOCTL_NOTIF_ID_VALID`` guards every notification against the caller having died (and
its pid been reused) before the shim acted on it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import queue
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from recorder.shim import seccomp
from recorder.shim.wire import Connect, Proc

LABEL = "seccomp-notify"
"""The ``tracer`` name this module's records carry."""

# The launcher: installs the filter, hands its listener to the shim, drops to the agent's uid and
# execs the agent. It resolves the program itself first, so the one exec the shim sees from it is
# the one that runs. (Runs as ``python -I -c``; argv: socket fd, uid, gid, filter hex, command.)
LAUNCH_CODE = r"""
import ctypes, os, shutil, signal, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
sock = socket.socket(fileno=int(sys.argv[1]))
uid, gid, prog, argv = int(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4]), sys.argv[5:]
path = argv[0] if "/" in argv[0] else shutil.which(argv[0])
if not path or not os.access(path, os.X_OK):
    sys.stderr.write("amb-shim: cannot run %r: not found or not executable\n" % argv[0]); sys.exit(127)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
fprog = Fprog(len(prog) // 8, prog)
nr = {"x86_64": 317, "aarch64": 277}[os.uname().machine]
fd = -1
for flags in (8 | 32, 8):  # NEW_LISTENER (| WAIT_KILLABLE_RECV where the kernel has it)
    fd = libc.syscall(nr, 1, flags, ctypes.byref(fprog))
    if fd >= 0:
        break
if fd < 0:
    e = ctypes.get_errno()
    sys.stderr.write("amb-shim: cannot install the seccomp filter: %s\n" % os.strerror(e)); sys.exit(126)
socket.send_fds(sock, [b"L"], [fd])
os.close(fd)
if sock.recv(1) != b"K":
    sys.exit(126)
sock.close()
if uid >= 0:
    os.setgroups([]); os.setgid(gid); os.setuid(uid)
    libc.prctl(4, 1, 0, 0, 0)  # dumpable again after the uid change, like any user process
signal.pthread_sigmask(signal.SIG_SETMASK, [])
try:
    os.execv(path, argv)
except OSError as e:
    sys.stderr.write("amb-shim: cannot run %r: %s\n" % (argv[0], e.strerror)); sys.exit(127)
"""

# ---- kernel interfaces -----------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.connect.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_libc.signalfd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]

_NOTIF_RECV, _NOTIF_SEND, _NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
_NOTIF_SET_FLAGS, _FD_SYNC_WAKE_UP = 0x40082104, 1
_NOTIF_SIZE, _RESP_SIZE = 80, 24
_FLAG_CONTINUE = 1

_PTRACE_CONT, _PTRACE_GETEVENTMSG, _PTRACE_SEIZE, _PTRACE_LISTEN = 7, 0x4201, 0x4206, 0x4208
_PTRACE_O_TRACEEXEC = 0x10
_EVENT_EXEC, _EVENT_STOP = 4, 128
_WALL, _WNOTHREAD = 0x40000000, 0x20000000
_STOP_SIGNALS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}

_SYS_PIDFD_OPEN, _SYS_PIDFD_GETFD = 434, 438  # the same on x86_64 and aarch64 (new-style numbers)

_COMMAND_NOT_RUN = 127
"""The launcher's exit when the command is not found or cannot be executed (a shell's 127)."""

_FLUSH_AFTER = 0.05
"""Seconds records may wait to be sent together (one wakeup of the receiver per batch)."""


RESERVE_CONNECTORS = 2
"""Threads started with the tracer, before the agent, to perform blocking connects when no new thread
can be made: a thread needs a pid, and the agent may hold every pid the container is allowed."""

UNOBSERVED = "unobserved"
"""A connect's ``error`` when its outcome could not be learnt (it went ahead as the caller made it)."""


def _errno_name(err: int) -> str:
    return errno.errorcode.get(err, f"E{err}")


def _ptrace(req: int, pid: int, addr: int = 0, data: int = 0) -> int:
    ctypes.set_errno(0)
    r = _libc.ptrace(req, pid, addr, data)
    if r == -1:
        e = ctypes.get_errno()
        if e:
            raise OSError(e, os.strerror(e))
    return r


def _signalfd_for_sigchld() -> int:
    mask = ctypes.create_string_buffer(128)
    bit = signal.SIGCHLD - 1
    mask[bit // 8] = bytes([1 << (bit % 8)])
    fd = _libc.signalfd(-1, mask, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"signalfd: {os.strerror(e)}")
    return fd


def _read_c_string(mem: int, addr: int, limit: int = 65536) -> bytes:
    """A NUL-terminated string from another process's memory, read page by page (never across
    into an unmapped page)."""
    out = bytearray()
    while len(out) < limit:
        n = 4096 - addr % 4096
        piece = os.pread(mem, n, addr)
        if not piece:
            break
        cut = piece.find(b"\0")
        if cut >= 0:
            out += piece[:cut]
            return bytes(out)
        out += piece
        addr += len(piece)
    return bytes(out[:limit])


def _read_argv(mem: int, addr: int, ptr: int, max_args: int = 65536) -> list[bytes]:
    fmt = "<%dQ" if ptr == 8 else "<%dI"
    argv: list[bytes] = []
    while addr and len(argv) < max_args:
        block = os.pread(mem, 64 * ptr, addr)
        pointers = struct.unpack(fmt % (len(block) // ptr), block[: len(block) // ptr * ptr])
        if not pointers:
            break
        for p in pointers:
            if not p:
                return argv
            argv.append(_read_c_string(mem, p))
        addr += len(pointers) * ptr
    return argv


def _read_cmdline(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        raw = f.read()
    return raw[:-1].split(b"\0") if raw else []


def _ppid(tid: int) -> int:
    """The parent of a thread's process, from /proc (``stat`` is far cheaper to produce than ``status``)."""
    with open(f"/proc/{tid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split(None, 2)[1])  # (after the name: state, ppid)


def _tgid(tid: int) -> int:
    """The process a thread belongs to, from /proc."""
    with open(f"/proc/{tid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    raise OSError(f"no Tgid in /proc/{tid}/status")


def _sockaddr(raw: bytes) -> tuple[str, str, int] | None:
    """(family, host, port) of an IPv4/IPv6 sockaddr; None for other families."""
    if len(raw) < 2:
        return None
    family = struct.unpack_from("=H", raw)[0]
    if family == socket.AF_INET and len(raw) >= 8:
        return "inet", socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack_from(">H", raw, 2)[0]
    if family == socket.AF_INET6 and len(raw) >= 24:
        return "inet6", socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack_from(">H", raw, 2)[0]
    return None


# ---- the tracer ------------------------------------------------------------------------------------------


@dataclass
class _Proc:
    pid: int
    ppid: int | None
    argv: list[bytes]
    cwd: bytes | None
    start_ns: int

    def ended(self, end_ns: int, exit_code: int | None = None, sig: int | None = None) -> Proc:
        """The record of this program ended at ``end_ns`` (no exit code: replaced by an exec, or
        still running when tracing stopped)."""
        return Proc(
            pid=self.pid,
            ppid=self.ppid,
            argv=self.argv,
            cwd=self.cwd,
            start_ns=self.start_ns,
            end_ns=end_ns,
            exit_code=exit_code,
            signal=sig,
            tracer=LABEL,
        )


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
        self.procs: dict[int, _Proc] = {}
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
        self.counts = {
            "notifications": 0,
            "execs": 0,
            "connects": 0,
            "connects_on_reserve": 0,
            "signals_passed": 0,
            "tracer_errors": 0,
        }
        self._out: list = []
        self._out_lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener = -1
        self._notif = ctypes.create_string_buffer(_NOTIF_SIZE)
        self._resp = ctypes.create_string_buffer(_RESP_SIZE)
        self._send_lock = threading.Lock()
        self._reserve: queue.SimpleQueue = queue.SimpleQueue()
        """Blocking connects for the reserve threads (a ``None`` ends one)."""

    # -- lifecycle (called from the shim's main thread) --

    def start(self, argv: list[str], cwd: str, timeout: float = 30.0, stderr=None) -> None:
        """Launch ``argv`` under the filter; returns once the tracer is ready (or has failed).
        ``stderr`` is the launcher's and the command's (``subprocess.Popen``'s argument)."""
        # SIGCHLD reaches the tracer through a signalfd, so it must be blocked in every thread: the
        # caller blocks it before starting any thread (see ``block_sigchld``).
        for _ in range(RESERVE_CONNECTORS):
            threading.Thread(target=self._serve_reserve, name="amb-shim-connect-reserve", daemon=True).start()
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
        for _ in range(RESERVE_CONNECTORS):
            self._reserve.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def kill_all(self, sig: int = signal.SIGKILL) -> int:
        """Signal every process under the command but its own; returns how many were signalled.

        That is every traced process, and every descendant of the command or of a traced process
        (one that forked without exec'ing is not traced)."""
        n = 0
        roots = {p for p in (self.root_pid, *list(self.procs)) if p is not None}
        for pid in _descendants(roots) | set(self.procs):
            if pid == self.root_pid:
                continue
            try:
                os.kill(pid, sig)
                n += 1
            except OSError:
                pass
        return n

    def others_alive(self) -> bool:
        return any(pid != self.root_pid for pid in list(self.procs))

    def _fail_closed(self) -> None:
        """Kill the command and everything traced, and reap the command (on the tracer thread)."""
        for pid in [p for p in (self.root_pid, *list(self.procs)) if p is not None]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (OSError, TypeError):
                pass
        if self.root_status is None and self.root_pid is not None:
            try:
                _pid, self.root_status = os.waitpid(self.root_pid, _WALL)
            except ChildProcessError:
                pass

    # -- the tracer thread --

    def _main(self, argv: list[str], cwd: str, stderr) -> None:
        sigfd = -1
        try:
            sigfd = _signalfd_for_sigchld()
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            with parent, child:
                # Started from this thread: it is the command's parent and, once seized, its tracer,
                # so this thread alone reaps it (``__WNOTHREAD``) and learns its status.
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",
                        "-c",
                        LAUNCH_CODE,
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
                    _pid, status = os.waitpid(proc.pid, _WALL)
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    if proc.returncode == _COMMAND_NOT_RUN:
                        self.root_status = status
                    else:
                        self.failed = f"the launcher sent no seccomp listener (exit {proc.returncode})"
                elif not fds:
                    self.failed = self.failed or "the launcher sent no seccomp listener"
                else:
                    self._listener = fds[0]
                    # Linux >= 6.6: the kernel switches straight between a waiting caller and this
                    # thread on one CPU instead of waking it on another (older kernels: EINVAL).
                    _libc.ioctl(self._listener, _NOTIF_SET_FLAGS, _FD_SYNC_WAKE_UP)
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
            if self._listener >= 0:
                os.close(self._listener)
            os.close(sigfd)
            self._flush(force=True)
            self.root_done.set()

    def _loop(self, sigfd: int, proc: subprocess.Popen) -> None:
        poller = select.poll()
        if self._listener >= 0:
            poller.register(self._listener, select.POLLIN)
        poller.register(sigfd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        self._reap(proc)  # a SIGCHLD may have come before the signalfd was polled
        while not self._stopping.is_set():
            timeout = int(_FLUSH_AFTER * 1000) if self._out else None
            for fd, ev in poller.poll(timeout):
                if fd == self._listener:
                    if ev & select.POLLIN:
                        self._notification()
                    elif ev & (select.POLLHUP | select.POLLERR):
                        poller.unregister(fd)  # no process under the filter is left
                elif fd == sigfd:
                    # SIGCHLDs coalesce: one read clears them all, and any state change after it
                    # raises a new one, so reaping until nothing is left misses nothing.
                    try:
                        os.read(sigfd, 4096)
                    except BlockingIOError:
                        pass
                    self._reap(proc)
                else:
                    try:
                        os.read(self._wake_r, 64)
                    except BlockingIOError:
                        pass
            self._flush()
        self._reap(proc)
        self._finish()

    def _reap(self, proc: subprocess.Popen) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | _WALL | _WNOTHREAD)
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
                self._queue(p.ended(now, code, sig))
            if pid == self.root_pid:
                self._flush(force=True)
                self.root_done.set()

    def _stopped(self, pid: int, status: int) -> None:
        sig, event = os.WSTOPSIG(status), status >> 16
        try:
            if event == _EVENT_EXEC:
                e = None
                try:
                    e = self.pending.pop(pid, None)
                    if e is None:  # exec'd from another thread: the kernel gave it the process's id
                        former = ctypes.c_ulong()
                        _ptrace(_PTRACE_GETEVENTMSG, pid, 0, ctypes.addressof(former))
                        e = self.pending.pop(former.value, None)
                    if e is not None:
                        # Stopped before the new program's first instruction: its argv is exactly
                        # what the kernel copied in, whatever the caller's memory holds now.
                        e.argv = _read_cmdline(pid)
                except Exception as exc:  # noqa: BLE001 - a record lost must not stop the tracer
                    self._error("exec", exc)
                finally:
                    _ptrace(_PTRACE_CONT, pid)  # (the process waits only for this; bookkeeping after)
                if e is not None:
                    self._commit(pid, e)
            elif event == _EVENT_STOP:
                # A group-stop (SIGSTOP and kin) stays a stop until SIGCONT; anything else resumes.
                _ptrace(_PTRACE_LISTEN if sig in _STOP_SIGNALS else _PTRACE_CONT, pid)
            else:  # a signal on its way to the process: deliver it unchanged
                self.counts["signals_passed"] += 1
                _ptrace(_PTRACE_CONT, pid, 0, sig)
        except OSError:
            pass  # it died meanwhile; its death is reported next

    def _commit(self, pid: int, e: _Exec) -> None:
        old = self.procs.get(pid)
        if old is not None:
            # The process replaces its program (a shell exec'ing its last command): the old program
            # ends there, with no exit code of its own.
            self._queue(old.ended(e.ts_ns))
        self.procs[pid] = _Proc(pid, e.ppid, e.argv or [], e.cwd, e.ts_ns)
        self.counts["execs"] += 1

    def _notification(self) -> None:
        ctypes.memset(self._notif, 0, _NOTIF_SIZE)
        if _libc.ioctl(self._listener, _NOTIF_RECV, self._notif) != 0:
            return  # ENOENT: the caller died before we read it; EINTR: try again on the next poll
        nid, tid, _flags, nr, arch = struct.unpack_from("=QIIiI", self._notif, 0)
        args = struct.unpack_from("=6Q", self._notif, 32)
        self.counts["notifications"] += 1
        kind, ptr = self.kinds.get((arch, nr & 0xFFFFFFFF), ("", 8))
        entry = None
        try:
            if kind == "connect":
                if self._connect(nid, tid, args):
                    return  # answered by the connect itself
            elif kind:
                entry = self._exec_entry(nid, tid, ptr, args, at=kind == "execveat")
        except Exception as exc:  # noqa: BLE001 - a record lost must not become an agent hung on its syscall
            self._error(kind, exc)
        self._respond(nid, flags=_FLAG_CONTINUE)
        if entry is not None:
            # What exec does not change (parent, cwd) is read while the kernel loads the program.
            try:
                self._exec_details(tid, entry)
            except Exception as exc:  # noqa: BLE001 - likewise
                self._error(kind, exc)

    def _error(self, kind: str, exc: Exception) -> None:
        self.counts["tracer_errors"] += 1
        self.last_error = f"{kind}: {type(exc).__name__}: {exc}"

    def _valid(self, nid: int) -> bool:
        return _libc.ioctl(self._listener, _NOTIF_ID_VALID, ctypes.byref(ctypes.c_uint64(nid))) == 0

    def _respond(self, nid: int, *, error: int = 0, flags: int = 0) -> None:
        """Let the syscall go ahead (``flags=_FLAG_CONTINUE``) or end it with ``error`` (0: success)."""
        with self._send_lock:
            struct.pack_into("=QqiI", self._resp, 0, nid, 0, error, flags)
            _libc.ioctl(self._listener, _NOTIF_SEND, self._resp)  # ENOENT if the caller died: nothing to do

    def _exec_entry(self, nid: int, tid: int, ptr: int, args: tuple, *, at: bool) -> _Exec | None:
        """While the caller waits: the seize that will report the exec's success (and stop the new
        program before its first instruction, when its argv is read)."""
        if not self._valid(nid):
            return None  # the caller is gone (and its pid may be reused)
        e = _Exec(0, 0, None, None, time.time_ns())
        if tid not in self.seized:
            try:
                _ptrace(_PTRACE_SEIZE, tid, 0, _PTRACE_O_TRACEEXEC)
                self.seized.add(tid)
            except OSError:
                # Traced by someone else (the agent's own strace or gdb): no exec-event stop will
                # come. Read the argv the caller passes now, and take the exec as having succeeded.
                mem = os.open(f"/proc/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    e.argv = _read_argv(mem, args[2] if at else args[1], ptr)
                finally:
                    os.close(mem)
                e.unconfirmed = True
        self.pending[tid] = e
        return e

    def _exec_details(self, tid: int, e: _Exec) -> None:
        e.ppid = _ppid(tid)
        if e.unconfirmed:
            e.tgid = _tgid(tid)
        try:
            e.cwd = os.readlink(f"/proc/{tid}/cwd".encode())
        except OSError:
            e.cwd = None
        if e.unconfirmed and self.pending.get(tid) is e:
            del self.pending[tid]
            self._commit(e.tgid, e)

    def _connect(self, nid: int, tid: int, args: tuple) -> bool:
        fd, addr, length = ctypes.c_int(args[0] & 0xFFFFFFFF).value, args[1], args[2] & 0xFFFFFFFF
        if not 2 <= length <= 128:
            return False
        mem = os.open(f"/proc/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.pread(mem, length, addr)
        finally:
            os.close(mem)
        target = _sockaddr(raw)
        if target is None:
            return False  # unix sockets and the like: local plumbing, not network attempts
        tgid = _tgid(tid)
        family, host, port = target
        ts = time.time_ns()
        pidfd = _libc.syscall(_SYS_PIDFD_OPEN, tgid, 0)
        if pidfd < 0:
            return False  # the caller is gone
        try:
            dup = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
            err = ctypes.get_errno() if dup < 0 else 0
        finally:
            os.close(pidfd)
        if dup < 0:
            if err == errno.EBADF:  # what the connect itself would have answered
                self._respond(nid, error=-err)
                self._queue(Connect(family=family, host=host, port=port, error="EBADF", pid=tgid, ts_ns=ts))
                return True
            # The socket cannot be had (an old kernel, a policy): the connect goes ahead unobserved.
            self._error("connect", OSError(err, f"pidfd_getfd: {os.strerror(err)}"))
            self._queue(Connect(family=family, host=host, port=port, error=UNOBSERVED, pid=tgid, ts_ns=ts))
            return False
        if not self._valid(nid):
            os.close(dup)
            return False
        self.counts["connects"] += 1
        stype = _sock_type(dup)
        proto = {int(socket.SOCK_STREAM): "tcp", int(socket.SOCK_DGRAM): "udp"}.get(stype, "")

        def perform() -> None:
            try:
                r = _libc.connect(dup, raw, length)
                err = ctypes.get_errno() if r < 0 else 0
            finally:
                os.close(dup)
            self._respond(nid, error=-err)
            self._queue(
                Connect(
                    family=family + (f"/{proto}" if proto else ""),
                    host=host,
                    port=port,
                    error=_errno_name(err) if err else None,
                    pid=tgid,
                    ts_ns=ts,
                )
            )

        if _fcntl_flags(dup) & os.O_NONBLOCK or stype != socket.SOCK_STREAM:
            perform()  # answers at once
        else:  # a blocking TCP connect can take minutes: not on the tracer's thread
            self._in_background(perform)
        return True

    def _in_background(self, job) -> None:
        """Run ``job`` on a thread of its own or, when no thread can be made (every pid is taken), on a
        reserve thread: it waits there for the connects before it, and is recorded all the same."""
        try:
            threading.Thread(target=job, name="amb-shim-connect", daemon=True).start()
        except RuntimeError:
            self.counts["connects_on_reserve"] += 1
            self._reserve.put(job)

    def _serve_reserve(self) -> None:
        while (job := self._reserve.get()) is not None:
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - the reserve must outlive one failed connect
                self._error("connect", exc)

    # -- output --

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
            self._queue(p.ended(now))
        self.procs.clear()
        self._flush(force=True)


def _descendants(roots: set[int]) -> set[int]:
    """Every live process below ``roots``, from the parent links in /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                children.setdefault(_ppid(int(name)), []).append(int(name))
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    found: set[int] = set()
    frontier = list(roots)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _sock_type(fd: int) -> int:
    s = socket.socket(fileno=os.dup(fd))
    try:
        return s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
    except OSError:
        return 0
    finally:
        s.close()


def _fcntl_flags(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETFL)


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
