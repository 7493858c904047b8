"""The notify tracer's seccomp filter, run without a kernel.

An interpreter for the classic-BPF instructions a seccomp filter may use (written from
linux/filter.h and the kernel's seccomp checker, not from the program's builder) runs the program
over every syscall number of every arch: a syscall must stop for the shim exactly when the table
lists it, and everything else, including every syscall of an arch the table does not know, must
run untouched.
"""

from __future__ import annotations

import struct

import pytest

from recorder.shim import seccomp

ALLOW, USER_NOTIF = 0x7FFF0000, 0x7FC00000
"""SECCOMP_RET_ALLOW and SECCOMP_RET_USER_NOTIF (linux/seccomp.h)."""
X86_64, I386, AARCH64, ARM = 0xC000003E, 0x40000003, 0xC00000B7, 0x40000028
X32_BIT = 0x40000000
SECCOMP_DATA = 64
"""sizeof(struct seccomp_data): nr, arch, instruction_pointer, args[6]."""
MAX_INSNS = 4096
"""BPF_MAXINSNS: the kernel refuses longer programs."""


class BadProgram(AssertionError):
    pass


def decode(prog: bytes) -> list[tuple[int, int, int, int]]:
    if not prog or len(prog) % 8:
        raise BadProgram(f"a program is whole 8-byte instructions, got {len(prog)} bytes")
    insns = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    if len(insns) > MAX_INSNS:
        raise BadProgram(f"{len(insns)} instructions, over the kernel's {MAX_INSNS}")
    return insns


def run(prog: bytes, arch: int, nr: int) -> int:
    """The program's verdict for one syscall (its number and arch; no arguments or pointer)."""
    insns = decode(prog)
    data = struct.pack("=iIQ6Q", nr if nr < 2**31 else nr - 2**32, arch, 0, *([0] * 6))
    assert len(data) == SECCOMP_DATA
    pc, acc = 0, 0
    for _ in range(len(insns)):  # classic BPF only jumps forward: at most one visit per instruction
        if not 0 <= pc < len(insns):
            raise BadProgram(f"fell off the program at {pc}")
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS: a 32-bit word of seccomp_data
            if k % 4 or k + 4 > SECCOMP_DATA:
                raise BadProgram(f"load of seccomp_data offset {k}")
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise BadProgram(f"instruction {code:#x} at {pc} is not one this filter should use")
    raise BadProgram("no return reached")


NOTIFIED = {
    "x86_64": {
        X86_64: {59, 322, 42, X32_BIT | 520, X32_BIT | 545, X32_BIT | 42},
        I386: {11, 358, 362},
    },
    "aarch64": {AARCH64: {221, 281, 203}},
}
"""Written out by hand from the syscall tables: execve, execveat, connect per arch (x32: the flagged
x32 numbers; i386 connects through socketcall, which is not decoded)."""


@pytest.mark.parametrize("machine", sorted(NOTIFIED))
def test_notifies_exactly_exec_and_connect_on_every_arch(machine: str) -> None:
    prog = seccomp.program(machine)
    for arch in (X86_64, I386, AARCH64, ARM, 0, 0xFFFFFFFF):
        expected = NOTIFIED[machine].get(arch, set())
        numbers = set(range(1024)) | {X32_BIT | n for n in range(1024)} | expected | {0xFFFFFFFF}
        notified = {nr for nr in numbers if run(prog, arch, nr) == USER_NOTIF}
        assert notified == expected, (machine, hex(arch))
        assert {run(prog, arch, nr) for nr in numbers - expected} <= {ALLOW}, (machine, hex(arch))


def test_the_tracer_decodes_what_the_filter_sends() -> None:
    for machine, arches in NOTIFIED.items():
        traced = seccomp.traced(machine)
        assert set(traced) == {(arch, nr) for arch, nrs in arches.items() for nr in nrs}
        assert {kind for kind, _ in traced.values()} == {"execve", "execveat", "connect"}
        # 32-bit callers (i386, x32) pass 4-byte pointers; 64-bit ones 8-byte.
        for (arch, nr), (_kind, ptr) in traced.items():
            assert ptr == (4 if arch == I386 or nr & X32_BIT else 8), (hex(arch), nr)


def test_an_unknown_machine_is_a_clear_error() -> None:
    with pytest.raises(OSError, match="no syscall table for riscv64"):
        seccomp.program("riscv64")
    assert seccomp.traced("riscv64") == {}


def test_the_interpreter_rejects_what_the_kernel_would() -> None:
    # The checks above are only as good as the interpreter: it must refuse a program that runs off
    # its end, reads past seccomp_data or uses an instruction outside the three.
    ret_allow = struct.pack("=HBBI", 0x06, 0, 0, ALLOW)
    with pytest.raises(BadProgram, match="fell off"):
        run(struct.pack("=HBBI", 0x15, 5, 5, 0) + ret_allow, X86_64, 0)
    with pytest.raises(BadProgram, match="offset 64"):
        run(struct.pack("=HBBI", 0x20, 0, 0, 64) + ret_allow, X86_64, 0)
    with pytest.raises(BadProgram, match="not one this filter"):
        run(struct.pack("=HBBI", 0x05, 0, 0, 0) + ret_allow, X86_64, 0)
    with pytest.raises(BadProgram, match="whole 8-byte"):
        run(ret_allow[:5], X86_64, 0)
    assert run(ret_allow, X86_64, 59) == ALLOW
