"""bench/shim_notify_probe: could the shim trace processes without ptrace? A feasibility probe.

    python bench/shim_notify_probe.py [--n 1800] [--rounds 3] [--no-ptrace-cap]

Not the shim: a measurement for its next step (see docs/containers.md, "Overhead"). ptrace-based
tracing costs ~1.06x on a fork-heavy workload on 2-core machines whatever is traced, because every
new process stops several times. seccomp user notification stops a process only at the syscalls
it names, and never on fork. In one agent container (the docker backend's flags), a supervisor
installs a filter that notifies it on execve, execveat and exit_group, reads each exec's argv from
the caller's memory while the caller waits (plus its cwd and parent from /proc), and lets the
syscall continue. N ``python3 -c pass`` runs as uid 1000 are timed with and without it, ABBA.
Prints the wall ratio and how many execs had their argv read.

Known gaps before it could replace strace: reading the memory of a uid-1000 process as root needs
CAP_SYS_PTRACE (added here unless --no-ptrace-cap; the agent, after its uid drop, has no
capabilities); and a descendant killed by a signal makes no exit_group call, so its signal is not
observed (only that it ended, through a pidfd).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from amb.images import ensure_images  # noqa: E402
from recorder.docker_backend import CAPS  # noqa: E402

SUPERVISOR = r'''
import ctypes, os, socket, struct, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
NR_SECCOMP, ARCH_X86_64 = 317, 0xC000003E
RET_ALLOW, RET_USER_NOTIF = 0x7FFF0000, 0x7FC00000
NOTIF_RECV, NOTIF_SEND = 0xC0502100, 0xC0182101
EXECVE, EXECVEAT, EXIT_GROUP = 59, 322, 231

def insn(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)

watched = [EXECVE, EXECVEAT, EXIT_GROUP]
prog = [insn(0x20, 0, 0, 4), insn(0x15, 1, 0, ARCH_X86_64), insn(0x06, 0, 0, RET_ALLOW), insn(0x20, 0, 0, 0)]
prog += [insn(0x15, len(watched) - i, 0, nr) for i, nr in enumerate(watched)]
prog += [insn(0x06, 0, 0, RET_ALLOW), insn(0x06, 0, 0, RET_USER_NOTIF)]
code = ctypes.create_string_buffer(b"".join(prog))

class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

fprog = Fprog(len(prog), ctypes.addressof(code))
stats = {"exec": 0, "argv": 0, "exit": 0, "errors": set()}

def read_argv(pid, argv_ptr):
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        mem.seek(argv_ptr)
        pointers = struct.unpack("16Q", mem.read(128))
        argv = []
        for p in pointers:
            if not p:
                break
            mem.seek(p)
            argv.append(mem.read(4096).split(b"\0", 1)[0])
    return argv

def supervise(fd):
    notif, resp = ctypes.create_string_buffer(80), ctypes.create_string_buffer(24)
    while True:
        ctypes.memset(notif, 0, 80)
        if libc.ioctl(fd, NOTIF_RECV, notif) != 0:
            if ctypes.get_errno() == 4:
                continue
            return
        nid, pid, _flags, nr = struct.unpack_from("QIIi", notif, 0)
        args = struct.unpack_from("6Q", notif, 32)
        if nr in (EXECVE, EXECVEAT):
            stats["exec"] += 1
            try:
                read_argv(pid, args[1] if nr == EXECVE else args[2])
                os.readlink(f"/proc/{pid}/cwd")
                with open(f"/proc/{pid}/stat", "rb") as f:
                    f.read()
                stats["argv"] += 1
            except OSError as e:
                stats["errors"].add(e.strerror)
        else:
            stats["exit"] += 1
        struct.pack_into("QqiI", resp, 0, nid, 0, 0, 1)  # SECCOMP_USER_NOTIF_FLAG_CONTINUE
        libc.ioctl(fd, NOTIF_SEND, resp)

parent, child = socket.socketpair()
pid = os.fork()
if pid == 0:
    libc.prctl(38, 1, 0, 0, 0)  # no_new_privs: lets an unprivileged process install the filter
    fd = libc.syscall(NR_SECCOMP, 1, 1 << 3, ctypes.byref(fprog))  # SET_MODE_FILTER, NEW_LISTENER
    if fd < 0:
        os._exit(97)
    socket.send_fds(child, [b"x"], [fd])
    child.recv(1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, fds, _, _ = socket.recv_fds(parent, 1, 1)
threading.Thread(target=supervise, args=(fds[0],), daemon=True).start()
parent.send(b"k")
_, status = os.waitpid(pid, 0)
print(f"notify-stats exec={stats['exec']} argv={stats['argv']} exit={stats['exit']} errors={sorted(stats['errors'])}")
sys.exit(os.waitstatus_to_exitcode(status))
'''

LOOP = r'''s=$(date +%s%N); for i in $(seq "$2"); do python3 -c pass; done; e=$(date +%s%N); echo "$1 $((e-s))"'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1800, help="python -c runs per side")
    p.add_argument("--rounds", type=int, default=3, help="ABBA rounds")
    p.add_argument("--no-ptrace-cap", action="store_true", help="run without CAP_SYS_PTRACE (argv reads then fail)")
    args = p.parse_args()
    block = max(1, args.n // (2 * args.rounds))

    import docker

    image = ensure_images(("agent",), log=lambda m: print(m, file=sys.stderr))["agent"].tag
    drop = "setpriv --reuid=1000 --regid=1000 --clear-groups"
    steps = [f'{drop} bash -c "$LOOP" _ warmup {max(20, block // 2)}']
    for _ in range(args.rounds):
        for label in ("plain", "notify", "notify", "plain"):
            if label == "plain":
                steps.append(f'{drop} bash -c "$LOOP" _ plain {block}')
            else:
                steps.append(f'python3 -c "$SUPERVISOR" {drop} bash -c "$LOOP" _ notify {block}')
    caps = CAPS + ([] if args.no_ptrace_cap else ["SYS_PTRACE"])
    client = docker.from_env()
    container = client.containers.run(
        image, ["bash", "-c", " && ".join(steps)], detach=True, init=True, network_mode="none",
        security_opt=["no-new-privileges"], cap_drop=["ALL"], cap_add=caps, read_only=True,
        tmpfs={"/tmp": "size=256m,mode=1777"}, nano_cpus=int(2e9), user="0:0",
        environment={"LOOP": LOOP, "SUPERVISOR": SUPERVISOR},
    )
    status = container.wait()["StatusCode"]
    logs = container.logs().decode()
    container.remove(force=True)
    if status != 0:
        print(logs, file=sys.stderr)
        raise SystemExit(f"probe container failed with exit {status}")
    times: dict[str, list[float]] = {"plain": [], "notify": []}
    for line in logs.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in times:
            times[parts[0]].append(int(parts[1]) / 1e9)
        elif line.startswith("notify-stats"):
            print(line)
    plain, notify = sum(times["plain"]), sum(times["notify"])
    print(f"plain blocks:  {' '.join(f'{t:.2f}' for t in times['plain'])}  total {plain:.2f}s")
    print(f"notify blocks: {' '.join(f'{t:.2f}' for t in times['notify'])}  total {notify:.2f}s")
    print(f"wall ratio notify/plain: {notify / plain:.3f} (the shim's target is <= 1.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
