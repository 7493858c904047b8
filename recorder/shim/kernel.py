"""The kernel interfaces of the seccomp-notify tracer (``recorder.shim.notify``), stdlib only.

libc through ctypes (``ptrace``, ``ioctl`` on the seccomp listener, ``connect``, ``signalfd``, the
pidfd syscalls) with the request numbers and flags they take, and what the tracer reads of a
traced process: its argv from its memory or from ``/proc``, its parent and thread group, the
address a ``connect`` names, the processes below it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
import threading

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.connect.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
libc.signalfd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]

NOTIF_RECV, NOTIF_SEND, NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
NOTIF_SET_FLAGS, FD_SYNC_WAKE_UP = 0x40082104, 1
NOTIF_SIZE, RESP_SIZE = 80, 24
FLAG_CONTINUE = 1

PTRACE_CONT, PTRACE_GETEVENTMSG, PTRACE_SEIZE, PTRACE_LISTEN = 7, 0x4201, 0x4206, 0x4208
PTRACE_O_TRACEEXEC = 0x10
EVENT_EXEC, EVENT_STOP = 4, 128
WALL, WNOTHREAD = 0x40000000, 0x20000000
STOP_SIGNALS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}

SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438  # the same on x86_64 and aarch64 (new-style numbers)


def ptrace(req: int, pid: int, addr: int = 0, data: int = 0) -> int:
    ctypes.set_errno(0)
    r = libc.ptrace(req, pid, addr, data)
    if r == -1:
        e = ctypes.get_errno()
        if e:
            raise OSError(e, os.strerror(e))
    return r


def signalfd_for_sigchld() -> int:
    mask = ctypes.create_string_buffer(128)
    bit = signal.SIGCHLD - 1
    mask[bit // 8] = bytes([1 << (bit % 8)])
    fd = libc.signalfd(-1, mask, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"signalfd: {os.strerror(e)}")
    return fd


def read_c_string(mem: int, addr: int, limit: int = 65536) -> bytes:
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


def read_argv(mem: int, addr: int, ptr: int, max_args: int = 65536) -> list[bytes]:
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
            argv.append(read_c_string(mem, p))
        addr += len(pointers) * ptr
    return argv


def read_cmdline(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        raw = f.read()
    return raw[:-1].split(b"\0") if raw else []


def cwd(pid: int) -> bytes | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd".encode())
    except OSError:
        return None


def ppid(tid: int) -> int:
    """The parent of a thread's process, from /proc (``stat`` is far cheaper to produce than ``status``)."""
    with open(f"/proc/{tid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split(None, 2)[1])  # (after the name: state, ppid)


def tgid(tid: int) -> int:
    """The process a thread belongs to, from /proc."""
    with open(f"/proc/{tid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    raise OSError(f"no Tgid in /proc/{tid}/status")


def sockaddr(raw: bytes) -> tuple[str, str, int] | None:
    """(family, host, port) of an IPv4/IPv6 sockaddr; None for other families."""
    if len(raw) < 2:
        return None
    family = struct.unpack_from("=H", raw)[0]
    if family == socket.AF_INET and len(raw) >= 8:
        return "inet", socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack_from(">H", raw, 2)[0]
    if family == socket.AF_INET6 and len(raw) >= 24:
        return "inet6", socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack_from(">H", raw, 2)[0]
    return None


def descendants(roots: set[int]) -> set[int]:
    """Every live process below ``roots``, from the parent links in /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                children.setdefault(ppid(int(name)), []).append(int(name))
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


def sock_type(fd: int) -> int:
    s = socket.socket(fileno=os.dup(fd))
    try:
        return s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
    except OSError:
        return 0
    finally:
        s.close()


class Listener:
    """The seccomp filter's listener: the notifications it hands over, and the answers to them
    (from any thread: a blocking connect is answered from its own)."""

    def __init__(self) -> None:
        self.fd = -1
        """Set once the launcher has handed it over."""
        self._notif = ctypes.create_string_buffer(NOTIF_SIZE)
        self._resp = ctypes.create_string_buffer(RESP_SIZE)
        self._send_lock = threading.Lock()

    def receive(self) -> tuple[int, int, int, int, tuple[int, ...]] | None:
        """The next notification: (id, calling thread, syscall number, arch, arguments)."""
        ctypes.memset(self._notif, 0, NOTIF_SIZE)
        if libc.ioctl(self.fd, NOTIF_RECV, self._notif) != 0:
            return None  # ENOENT: the caller died before we read it; EINTR: try again on the next poll
        nid, tid, _flags, nr, arch = struct.unpack_from("=QIIiI", self._notif, 0)
        return nid, tid, nr, arch, struct.unpack_from("=6Q", self._notif, 32)

    def valid(self, nid: int) -> bool:
        """Whether the caller still waits (it has not died, and its pid cannot have been reused)."""
        return libc.ioctl(self.fd, NOTIF_ID_VALID, ctypes.byref(ctypes.c_uint64(nid))) == 0

    def respond(self, nid: int, *, error: int = 0, flags: int = 0) -> None:
        """Let the syscall go ahead (``flags=FLAG_CONTINUE``) or end it with ``error`` (0: success)."""
        with self._send_lock:
            struct.pack_into("=QqiI", self._resp, 0, nid, 0, error, flags)
            libc.ioctl(self.fd, NOTIF_SEND, self._resp)  # ENOENT if the caller died: nothing to do

    def wake_up_in_sync(self) -> None:
        """Linux >= 6.6: the kernel switches straight between a waiting caller and the tracer's
        thread on one CPU instead of waking it on another (older kernels: EINVAL, ignored)."""
        libc.ioctl(self.fd, NOTIF_SET_FLAGS, FD_SYNC_WAKE_UP)
