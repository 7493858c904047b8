"""The notify tracer's launcher: the process that becomes the agent.

``recorder.shim.notify`` starts it as ``python -I launch.py SOCKET_FD UID GID FILTER_HEX COMMAND...``.
It installs the seccomp filter (``recorder.shim.seccomp``'s program, as hex), hands the filter's
listener to the shim over the socket, waits for the shim to say it listens, drops to the agent's
uid and execs the command. It resolves the program itself first, so the one exec the shim sees
from it is the one that runs. It imports the standard library only (``-I``: nothing of the agent's
environment or of amb is on its path).

Exits 127 when the command is not found or cannot be executed (a shell's answer), 126 when the
filter cannot be installed or the shim does not answer.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import sys
from typing import NoReturn

COMMAND_NOT_RUN = 127
CANNOT_TRACE = 126
_SECCOMP = {"x86_64": 317, "aarch64": 277}
"""The seccomp syscall's number by machine."""
_SET_MODE_FILTER = 1
_NEW_LISTENER, _WAIT_KILLABLE_RECV = 8, 32


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _fail(code: int, message: str) -> NoReturn:
    sys.stderr.write(f"amb-shim: {message}\n")
    sys.exit(code)


def _install_filter(libc: ctypes.CDLL, program: bytes) -> int:
    """The filter's listener fd (the filter applies to this process and what it execs)."""
    fprog = _Fprog(len(program) // 8, program)
    nr = _SECCOMP[os.uname().machine]
    fd = -1
    for flags in (_NEW_LISTENER | _WAIT_KILLABLE_RECV, _NEW_LISTENER):  # the first where the kernel has it
        fd = libc.syscall(nr, _SET_MODE_FILTER, flags, ctypes.byref(fprog))
        if fd >= 0:
            return fd
    _fail(CANNOT_TRACE, f"cannot install the seccomp filter: {os.strerror(ctypes.get_errno())}")


def _hand_over(sock: socket.socket, listener: int) -> None:
    """Send the listener to the shim; go on only once it says it listens."""
    socket.send_fds(sock, [b"L"], [listener])
    os.close(listener)
    if sock.recv(1) != b"K":
        sys.exit(CANNOT_TRACE)
    sock.close()


def _become_agent(libc: ctypes.CDLL, uid: int, gid: int) -> None:
    if uid >= 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE again after the uid change, like any user process
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def main(args: list[str]) -> NoReturn:
    libc = ctypes.CDLL(None, use_errno=True)
    sock = socket.socket(fileno=int(args[0]))
    uid, gid, program, argv = int(args[1]), int(args[2]), bytes.fromhex(args[3]), args[4:]
    path = argv[0] if "/" in argv[0] else shutil.which(argv[0])
    if not path or not os.access(path, os.X_OK):
        _fail(COMMAND_NOT_RUN, f"cannot run {argv[0]!r}: not found or not executable")
    _hand_over(sock, _install_filter(libc, program))
    _become_agent(libc, uid, gid)
    try:
        os.execv(path, argv)
    except OSError as e:
        _fail(COMMAND_NOT_RUN, f"cannot run {argv[0]!r}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
