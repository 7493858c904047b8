"""The seccomp filter of the notify tracer: which syscalls stop for the shim, as a classic-BPF program.

Pure data and assembly, no kernel call: ``program`` builds the filter that the notify tracer's
launcher installs (``recorder.shim.notify``), and ``traced`` says how the tracer decodes what the
filter sent it. The filter's contract:

- a syscall listed in ``SYSCALLS`` for the caller's audit arch returns ``RET_USER_NOTIF`` (the shim
  gets a notification and decides);
- every other syscall of a known arch, and every syscall of an arch the table does not know,
  returns ``RET_ALLOW`` (runs untouched: the filter never denies or kills).

x32 calls come in with the x86_64 arch and a flagged number (``X32``). i386 programs connect
through socketcall(2), which is not decoded (their network is the same internal one; the exec is
what matters there).
"""

from __future__ import annotations

import platform
import struct

AUDIT_ARCH = {"x86_64": 0xC000003E, "i386": 0x40000003, "aarch64": 0xC00000B7}
X32 = 0x40000000

Syscall = tuple[str, int]
"""(what it is: ``execve`` / ``execveat`` / ``connect``, the caller's pointer size in bytes)"""

SYSCALLS: dict[str, dict[int, dict[int, Syscall]]] = {
    "x86_64": {
        AUDIT_ARCH["x86_64"]: {
            59: ("execve", 8),
            322: ("execveat", 8),
            42: ("connect", 8),
            X32 | 520: ("execve", 4),
            X32 | 545: ("execveat", 4),
            X32 | 42: ("connect", 4),
        },
        AUDIT_ARCH["i386"]: {11: ("execve", 4), 358: ("execveat", 4), 362: ("connect", 4)},
    },
    "aarch64": {AUDIT_ARCH["aarch64"]: {221: ("execve", 8), 281: ("execveat", 8), 203: ("connect", 8)}},
}
"""Machine (``uname -m``) -> audit arch -> syscall number -> what it is."""

RET_ALLOW, RET_USER_NOTIF = 0x7FFF0000, 0x7FC00000

# The three instructions the program uses (linux/filter.h: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K,
# BPF_RET|BPF_K), and where seccomp_data keeps the syscall number and the audit arch.
LD_W_ABS, JEQ_K, RET_K = 0x20, 0x15, 0x06
NR_OFFSET, ARCH_OFFSET = 0, 4
INSN = struct.Struct("HBBI")
"""One ``struct sock_filter``: code, jump-if-true, jump-if-false, constant."""
_insn = INSN.pack


def machine_table(machine: str | None = None) -> dict[int, dict[int, Syscall]]:
    """The audit arches and syscalls traced on ``machine`` (default: this one)."""
    name = machine or platform.machine()
    table = SYSCALLS.get(name)
    if table is None:
        raise OSError(f"no syscall table for {name}")
    return table


def program(machine: str | None = None) -> bytes:
    """The filter: dispatch on the arch, then one compare per traced syscall number.

    Layout: ``ld arch``; one ``jeq`` per known arch, to its block; ``ret ALLOW``. Each block:
    ``ld nr``; one ``jeq`` per traced number, to the block's ``ret USER_NOTIF``; ``ret ALLOW``;
    ``ret USER_NOTIF``.
    """
    arches = list(machine_table(machine).items())
    blocks = []
    for _arch, calls in arches:
        nrs = sorted(calls)
        block = [_insn(LD_W_ABS, 0, 0, NR_OFFSET)]
        block += [_insn(JEQ_K, len(nrs) - i, 0, nr) for i, nr in enumerate(nrs)]
        block += [_insn(RET_K, 0, 0, RET_ALLOW), _insn(RET_K, 0, 0, RET_USER_NOTIF)]
        blocks.append(block)
    head = [_insn(LD_W_ABS, 0, 0, ARCH_OFFSET)]
    start = 1 + len(arches) + 1  # index of the first block
    for i, (arch, _calls) in enumerate(arches):
        here = 1 + i
        head.append(_insn(JEQ_K, start - (here + 1), 0, arch))
        start += len(blocks[i])
    head.append(_insn(RET_K, 0, 0, RET_ALLOW))
    return b"".join(head + [insn for block in blocks for insn in block])


def traced(machine: str | None = None) -> dict[tuple[int, int], Syscall]:
    """(audit arch, syscall number) -> what it is, for every syscall ``program`` notifies."""
    return {
        (arch, nr): kind
        for arch, calls in SYSCALLS.get(machine or platform.machine(), {}).items()
        for nr, kind in calls.items()
    }
