"""The connects of the notify tracer (``recorder.shim.notify``): performed for the agent, recorded
with their outcome.

A ``connect`` to an IPv4 or IPv6 address is performed by the shim on the caller's own socket (a
duplicate from ``pidfd_getfd``: the same open socket, same flags, same namespace), and its result
is returned as the syscall's: so the record has the outcome as well as the address. A blocking TCP
connect can take minutes, so it runs on a thread of its own, or on a reserve thread when no
thread can be made.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import queue
import socket
import threading
import time
from collections.abc import Callable

from recorder.shim import kernel
from recorder.shim.wire import Connect

RESERVE_CONNECTORS = 2
"""Threads started with the tracer, before the agent, to perform blocking connects when no new thread
can be made: a thread needs a pid, and the agent may hold every pid the container is allowed."""

UNOBSERVED = "unobserved"
"""A connect's ``error`` when its outcome could not be learnt (it went ahead as the caller made it)."""


class Connector:
    """Performs the connects the filter hands over. ``record`` takes each ``Connect`` message,
    ``failed(kind, exc)`` each one that could not be recorded; ``counts`` (the tracer's) counts
    ``connects`` and ``connects_on_reserve``."""

    def __init__(
        self,
        listener: kernel.Listener,
        record: Callable[[Connect], None],
        failed: Callable[[str, Exception], None],
        counts: dict[str, int],
    ):
        self.listener = listener
        self.record = record
        self.failed = failed
        self.counts = counts
        self._reserve: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        """Blocking connects for the reserve threads (a ``None`` ends one)."""

    def start(self) -> None:
        """Start the reserve threads (before the agent, which may take every pid)."""
        for _ in range(RESERVE_CONNECTORS):
            threading.Thread(target=self._serve_reserve, name="amb-shim-connect-reserve", daemon=True).start()

    def stop(self) -> None:
        for _ in range(RESERVE_CONNECTORS):
            self._reserve.put(None)

    def take(self, nid: int, tid: int, args: tuple[int, ...]) -> bool:
        """Perform the notified connect; True if it is answered here (now or from its thread),
        False if the syscall should go ahead as the caller made it."""
        fd, addr, length = ctypes.c_int(args[0] & 0xFFFFFFFF).value, args[1], args[2] & 0xFFFFFFFF
        if not 2 <= length <= 128:
            return False
        mem = os.open(f"/proc/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.pread(mem, length, addr)
        finally:
            os.close(mem)
        target = kernel.sockaddr(raw)
        if target is None:
            return False  # unix sockets and the like: local plumbing, not network attempts
        tgid = kernel.tgid(tid)
        family, host, port = target
        ts = time.time_ns()

        def record(error: str | None, proto: str = "") -> None:
            kind = family + (f"/{proto}" if proto else "")
            self.record(Connect(family=kind, host=host, port=port, error=error, pid=tgid, ts_ns=ts))

        dup, err = _duplicate(tgid, fd)
        if dup is None:
            return False  # the caller is gone
        if dup < 0:
            if err == errno.EBADF:  # what the connect itself would have answered
                self.listener.respond(nid, error=-err)
                record("EBADF")
                return True
            # The socket cannot be had (an old kernel, a policy): the connect goes ahead unobserved.
            self.failed("connect", OSError(err, f"pidfd_getfd: {os.strerror(err)}"))
            record(UNOBSERVED)
            return False
        if not self.listener.valid(nid):
            os.close(dup)
            return False
        self.counts["connects"] += 1
        stype = kernel.sock_type(dup)
        proto = {int(socket.SOCK_STREAM): "tcp", int(socket.SOCK_DGRAM): "udp"}.get(stype, "")

        def perform() -> None:
            try:
                r = kernel.libc.connect(dup, raw, length)
                err = ctypes.get_errno() if r < 0 else 0
            finally:
                os.close(dup)
            self.listener.respond(nid, error=-err)
            record(errno.errorcode.get(err, f"E{err}") if err else None, proto)

        if fcntl.fcntl(dup, fcntl.F_GETFL) & os.O_NONBLOCK or stype != socket.SOCK_STREAM:
            perform()  # answers at once
        else:  # a blocking TCP connect can take minutes: not on the tracer's thread
            self._in_background(perform)
        return True

    def _in_background(self, job: Callable[[], None]) -> None:
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
                self.failed("connect", exc)


def _duplicate(tgid: int, fd: int) -> tuple[int | None, int]:
    """The caller's socket ``fd`` duplicated into this process (with the errno when that failed: a
    negative fd); None when the caller is gone."""
    pidfd = kernel.libc.syscall(kernel.SYS_PIDFD_OPEN, tgid, 0)
    if pidfd < 0:
        return None, 0
    try:
        dup = kernel.libc.syscall(kernel.SYS_PIDFD_GETFD, pidfd, fd, 0)
        return dup, ctypes.get_errno() if dup < 0 else 0
    finally:
        os.close(pidfd)
