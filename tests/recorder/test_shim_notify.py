"""The seccomp-notify tracer on the cases where it differs from strace, against ground truth.

Real runs under the shim (as root here, where the filter can be installed), real receiver and
spool. Each case is something an agent does that a careless exec/exit observer gets wrong.
"""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

from recorder.shim.local import run_local
from tests.recorder.shim_helpers import payloads, shim_events

TRACER = "seccomp-notify"


def _run(tmp_path: Path, argv: list[str], run_id: str = "n") -> tuple[int, list]:
    store = tmp_path / "store"
    result = run_local(store, run_id, tmp_path / "ws", argv, tracer=TRACER, timeout=120)
    assert result.error is None
    events = shim_events(store, run_id)
    notes = payloads(events, "note")
    assert notes[0].data["tracer"] == TRACER and notes[0].data["fallback"] is False
    return result.exit_code, events


def test_only_the_exec_that_succeeded_is_a_program(tmp_path: Path) -> None:
    # execvp tries each PATH entry in turn: two failed execs, then the real one.
    code = textwrap.dedent("""\
        import os
        os.environ["PATH"] = "/nonexistent-a:/nonexistent-b:" + os.environ["PATH"]
        os.execvp("sh", ["sh", "-c", "exit 4"])
    """)
    rc, events = _run(tmp_path, [sys.executable, "-c", code])
    assert rc == 4
    procs = payloads(events, "process.exited")
    assert [(p.argv[:2], p.exit_code) for p in procs] == [([sys.executable, "-c"], None), (["sh", "-c"], 4)]
    # One process, two programs: the python image ends where sh begins.
    assert procs[0].pid == procs[1].pid and procs[0].end_ns == procs[1].start_ns


def test_signals_of_descendants_are_recorded(tmp_path: Path) -> None:
    running = "while ! grep -q sleep /proc/$p/comm 2>/dev/null; do :; done"  # past its exec
    script = (
        f"sleep 30 & p=$!; {running}; kill -KILL $p; sleep 31 & p=$!; {running}; kill -TERM $p; "
        f"sleep 32 & p=$!; {running}; kill -USR1 $p; wait $p"
    )
    rc, events = _run(tmp_path, ["bash", "-c", script])
    assert rc == 128 + 10
    sleeps = {
        tuple(p.argv): (p.exit_code, p.signal)
        for p in payloads(events, "process.exited")
        if p.argv[:1] == ["sleep"]
    }
    assert sleeps == {("sleep", "30"): (None, 9), ("sleep", "31"): (None, 15), ("sleep", "32"): (None, 10)}


def test_stopped_and_continued_process_finishes(tmp_path: Path) -> None:
    script = (
        "sleep 0.5 & p=$!; while ! grep -q sleep /proc/$p/comm 2>/dev/null; do :; done; "
        "kill -STOP $p; sleep 0.2; grep '^State:' /proc/$p/status > st; "
        "kill -CONT $p; wait $p; echo $? > rc"
    )
    rc, events = _run(tmp_path, ["bash", "-c", script])
    assert rc == 0
    # The stop was a real stop (under a tracer a group-stop shows as a tracing stop) ...
    assert (tmp_path / "ws/st").read_text().split()[1] in ("T", "t")
    assert (tmp_path / "ws/rc").read_text() == "0\n"  # ... and the process went on to finish
    (sleep,) = [p for p in payloads(events, "process.exited") if p.argv == ["sleep", "0.5"]]
    assert sleep.exit_code == 0


def test_exec_from_a_thread_is_the_process(tmp_path: Path) -> None:
    code = textwrap.dedent("""\
        import os, threading
        print(os.getpid(), file=open("pid", "w"), flush=True)
        t = threading.Thread(target=lambda: os.execv("/bin/sh", ["sh", "-c", "exit 6"]))
        t.start(); t.join()
    """)
    rc, events = _run(tmp_path, [sys.executable, "-c", code])
    assert rc == 6
    pid = int((tmp_path / "ws/pid").read_text())
    (sh,) = [p for p in payloads(events, "process.exited") if p.argv == ["sh", "-c", "exit 6"]]
    assert (sh.pid, sh.exit_code) == (pid, 6)


def test_agent_may_trace_its_own_children(tmp_path: Path) -> None:
    # The agent's own strace attaches first; the shim cannot seize that child, and still records it.
    rc, events = _run(tmp_path, ["strace", "-f", "-o", "/dev/null", "sh", "-c", "exit 2"])
    assert rc == 2
    argvs = [p.argv for p in payloads(events, "process.exited")]
    assert ["sh", "-c", "exit 2"] in argvs and argvs.count(
        ["strace", "-f", "-o", "/dev/null", "sh", "-c", "exit 2"]
    ) == 1


def test_connects_are_performed_and_their_outcomes_recorded(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    open_port = server.getsockname()[1]
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()
    code = textwrap.dedent(f"""\
        import errno, socket
        out = []
        s = socket.socket(); s.connect(("127.0.0.1", {open_port})); out.append(s.getpeername()[1])
        s.sendall(b"hi"); s.close()
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", {closed_port}))
        except ConnectionRefusedError:
            out.append("refused")
        s = socket.socket(); s.setblocking(False)
        out.append(errno.errorcode[s.connect_ex(("127.0.0.1", {open_port}))])
        u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        u.connect(("::1", 53)); out.append(u.getpeername()[1])
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect("/nonexistent.sock")
        except OSError as e:
            out.append(errno.errorcode[e.errno])
        import ctypes, struct
        libc = ctypes.CDLL(None, use_errno=True)
        addr = struct.pack("=H2s4s8x", socket.AF_INET, (9).to_bytes(2, "big"), socket.inet_aton("127.0.0.1"))
        out.append(errno.errorcode[ctypes.get_errno()] if libc.connect(999, addr, len(addr)) else "connected")
        print(out, file=open("out", "w"))
    """)
    try:
        rc, events = _run(tmp_path, [sys.executable, "-c", code])
        conn, _ = server.accept()
        assert conn.recv(2) == b"hi"  # the connect the shim performed is the agent's own socket
    finally:
        server.close()
    assert rc == 0
    assert (
        tmp_path / "ws/out"
    ).read_text() == f"[{open_port}, 'refused', 'EINPROGRESS', 53, 'ENOENT', 'EBADF']\n"
    reqs = [(r.scheme, r.host, r.port, r.error) for r in payloads(events, "network.request")]
    assert reqs == [
        ("tcp", "127.0.0.1", open_port, None),
        ("tcp", "127.0.0.1", closed_port, "ECONNREFUSED"),
        ("tcp", "127.0.0.1", open_port, "EINPROGRESS"),
        ("udp", "::1", 53, None),
        ("", "127.0.0.1", 9, "EBADF"),
    ]  # (no socket, so no protocol)


def test_a_command_that_cannot_run_exits_127(tmp_path: Path) -> None:
    # As a shell says it: the launcher finds no program, so nothing runs under the filter.
    rc, events = _run(tmp_path, ["no-such-agent-binary-xyz"])
    assert rc == 127
    assert payloads(events, "process.exited") == []
    assert payloads(events, "note")[-1].data["exit_code"] == 127
