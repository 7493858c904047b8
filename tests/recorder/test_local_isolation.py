"""The local agent's own namespaces (``recorder.isolation``): it sees its own processes, no others.

The threat: an ordinary user launches amb-record through a wrapper that holds the real key in its
environment (``env OPENAI_API_KEY=... timeout 60 amb-record ...``, as a job script or a make recipe
does), and the agent, running as the same user, reads the key from the wrapper's
``/proc/<pid>/environ`` or memory. Here the agent is a scanner: it reads every ``environ``,
``cmdline`` and readable ``mem`` it can see, tries the wrapper by its real pid (handed over in a
file) with ``/proc``, ``ptrace`` and ``kill``, and unmounts its ``/proc`` from a user namespace of
its own to look below. Run as ``nobody`` (``tests/recorder/ordinary_user.py``).

Where the namespaces cannot be had (no ``unshare``; a kernel that refuses user namespaces, made
real here by a user namespace whose ``user.max_user_namespaces`` is 0, as a distribution or a
container sets it), amb-record says so in one line at start, records it in ``run.started``, and
goes on, or refuses with ``--isolation required``.
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from recorder.spool import spool_path
from schemas.codec import decode_event
from schemas.frames import scan
from tests.fakes.upstream import FakeUpstream
from tests.recorder.ordinary_user import NOBODY, as_nobody, nobody_dir
from tests.recorder.processes import running_with

BIN = Path(sys.executable).parent
AMB_RECORD = str(BIN / "amb-record")

SCANNER = r"""
import ctypes, json, os, sys, time, urllib.request
key = sys.argv[1][::-1].encode()  # reversed on the command line: anyone may read a command line
me = os.getpid()
def read(path):
    with open(path, "rb") as f:
        return f.read()
def read_mem(pid):
    out = []
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in read(f"/proc/{pid}/maps").decode().splitlines():
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if "r" in line.split()[1] and hi - lo <= 1 << 28:
                try:
                    mem.seek(lo); out.append(mem.read(hi - lo))
                except OSError:
                    pass
    return b"".join(out)
seen, found = {}, []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == me:
        continue
    pid = int(name)
    try:
        seen[pid] = read(f"/proc/{pid}/comm").decode().strip()
    except OSError:
        continue
    for channel in ("environ", "cmdline", "mem"):
        try:
            data = read_mem(pid) if channel == "mem" else read(f"/proc/{pid}/{channel}")
        except OSError:
            continue
        if key in data:
            found.append([channel, pid, seen[pid]])
deadline = time.monotonic() + 60
while not os.path.exists("wrapper.pid") and time.monotonic() < deadline:
    time.sleep(0.05)
wrapper = int(read("wrapper.pid"))  # its pid outside, where it holds the key
reach = {}
try:
    data = read(f"/proc/{wrapper}/environ")
    reach["environ"] = "read"
    if key in data:
        found.append(["environ", wrapper, "wrapper"])
except OSError as e:
    reach["environ"] = e.strerror
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(16, wrapper, None, None) == 0:  # PTRACE_ATTACH
    reach["ptrace"] = "attached"
    os.waitpid(wrapper, 0x40000000)  # __WALL: the attach stop, before the detach
    libc.ptrace(17, wrapper, None, None)  # PTRACE_DETACH
else:
    reach["ptrace"] = os.strerror(ctypes.get_errno())
try:
    os.kill(wrapper, 0)
    reach["kill"] = "sent"
except OSError as e:
    reach["kill"] = e.strerror
r, w = os.pipe()
if os.fork() == 0:  # root of a user namespace of its own, it unmounts its /proc to see what is below
    os.close(r)
    if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
        said = "unshare: " + os.strerror(ctypes.get_errno())
    elif libc.umount2(b"/proc", 2) != 0:  # MNT_DETACH
        said = os.strerror(ctypes.get_errno())
    else:
        said = f"unmounted: {sum(n.isdigit() for n in os.listdir('/proc'))} processes below"
    os.write(w, said.encode()); os._exit(0)
os.close(w)
reach["unmount_proc"] = os.read(r, 4096).decode()
os.wait()
placeholder = os.environ["OPENAI_API_KEY"].encode()
call = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Authorization": "Bearer " + placeholder.decode(), "Content-Type": "application/json"},
)
with urllib.request.urlopen(call, timeout=60) as answer:
    status = answer.status
json.dump({"seen": seen, "found": found, "reach": reach, "status": status,
           "control_env": placeholder in read("/proc/self/environ"),
           "control_mem": placeholder in read_mem(me)}, open("scan.json", "w"))
"""


def _wrapped_run(home: Path, key: str, amb_args: list[str], fake: FakeUpstream) -> tuple[dict, str, int]:
    """``env OPENAI_API_KEY=KEY timeout 60 amb-record ... -- python scan.py`` as ``nobody``; returns
    what the scanner found, amb-record's stderr and the pid of ``timeout``."""
    ws, store, stage = home / "ws", home / "store", home / "stage"
    for d in (ws, stage):
        d.mkdir()
        os.chown(d, NOBODY, NOBODY)
    (ws / "scan.py").write_text(SCANNER)
    record = [AMB_RECORD, "--store", str(store), "--upstream", f"openai={fake.url}", *amb_args]
    wrapper = ["env", f"OPENAI_API_KEY={key}", "timeout", "60", *record, "--", sys.executable, "scan.py"]
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home)}
    proc = subprocess.Popen(
        as_nobody([*wrapper, key[::-1]], stage), cwd=ws, env=env, stderr=subprocess.PIPE, text=True
    )
    # Every wrapper above execs the next: the pid is that of `timeout`, which holds the key.
    (ws / "wrapper.pid").write_text(str(proc.pid))
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    return json.loads((ws / "scan.json").read_text()), stderr, proc.pid


def _events(store: Path, run_id: str) -> list:
    return [decode_event(b) for b in scan(spool_path(store, run_id, "recorder").read_bytes()).bodies]


def test_an_isolated_agent_finds_the_key_nowhere_and_is_recorded_in_full():
    key = f"sk-proj-REAL-{secrets.token_hex(16)}"
    run = f"isolated-{secrets.token_hex(3)}"
    with nobody_dir("nsagent-") as home, FakeUpstream() as fake:
        found, stderr, _ = _wrapped_run(home, key, ["--run-id", run, "--shim"], fake)
        store = home / "store"
        assert found["control_env"] and found["control_mem"], found  # the scanner's readers work
        assert found["found"] == [], found
        # The wrapper cannot even be named: its pid means nothing in the agent's PID namespace.
        reach = found["reach"]
        assert (reach["environ"], reach["ptrace"], reach["kill"]) == (
            "No such file or directory", "No such process", "No such process"
        ), found  # fmt: skip
        # Its own /proc cannot be taken away to show the host's below it: the kernel locks it.
        assert reach["unmount_proc"] == "Invalid argument", found
        seen = {int(pid): comm for pid, comm in found["seen"].items()}
        assert 1 in seen and max(seen) < 100, seen  # its init and its own tree only
        assert not {"timeout", "amb-record", "env"} & set(seen.values()), seen
        assert "not isolated" not in stderr and "your other processes are hidden" in stderr
        # Recorded in full: the model call through the proxy, the shim's facts, a clean verify.
        started = next(e.payload for e in _events(store, run) if e.kind == "run.started")
        assert (started.isolation.kind, started.isolation.requested) == ("namespaces", "best-effort")
        assert found["status"] == 200 and fake.requests[-1].headers["authorization"] == f"Bearer {key}"
        con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
        kinds = dict(
            con.execute("SELECT kind, count(*) FROM events WHERE run_id = ? GROUP BY 1", [run]).fetchall()
        )
        assert kinds["model_call.completed"] == 1, kinds
        processes = [
            json.loads(p)
            for (p,) in con.execute(
                "SELECT payload FROM events WHERE run_id = ? AND kind = 'process.exited'", [run]
            ).fetchall()
        ]
        assert any(p["tracer"] != "recorder" and "scan.py" in p["argv"] for p in processes), processes
        written = con.execute(
            "SELECT payload->>'path' FROM events WHERE run_id = ? AND kind = 'file.written'", [run]
        ).fetchall()
        assert ("scan.json",) in written, written
        con.close()
        verify = subprocess.run(
            [str(BIN / "amb"), "verify", "--store", str(store), run], capture_output=True, text=True
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_without_isolation_the_same_agent_finds_the_key_in_the_wrapper():
    # The scanner's teeth: what --isolation off (and a system without namespaces) leaves open.
    key = f"sk-proj-REAL-{secrets.token_hex(16)}"
    with nobody_dir("nsagent-") as home, FakeUpstream() as fake:
        found, stderr, wrapper = _wrapped_run(home, key, ["--isolation", "off"], fake)
    assert found["reach"]["environ"] == "read", found
    assert ["environ", wrapper, "timeout"] in found["found"], found
    assert "not isolated" not in stderr  # asked for: nothing to warn about but the key's reach
    assert "your other processes' environments" in stderr


def _plain_run(tmp_path: Path, args: list[str], agent: str, *, wrap: tuple[str, ...] = (), **env: str):
    """amb-record (as root) with ``env`` as its whole environment; the agent is a Python snippet."""
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    run = f"plain-{secrets.token_hex(3)}"
    argv = [
        *wrap,
        AMB_RECORD,
        "--store",
        str(store),
        "--run-id",
        run,
        *args,
        "--",
        sys.executable,
        "-c",
        agent,
    ]
    proc = subprocess.run(argv, cwd=ws, env={"HOME": str(tmp_path), **env}, capture_output=True, text=True)
    return proc, store, ws, run


PARENT = "import os; open('parent.txt', 'w').write(open(f'/proc/{os.getppid()}/comm').read().strip())"
"""The agent names its parent: amb-record itself when it is not isolated (its init when it is)."""


def test_without_unshare_the_run_says_so_at_start_and_records_it(tmp_path):
    path = str(BIN)  # the project's tools, no util-linux
    proc, store, ws, run = _plain_run(tmp_path, [], PARENT, PATH=path)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "not isolated" in line]
    assert said == [
        "amb-record: warning: the local agent is not isolated (`unshare` (util-linux) is not on PATH): it "
        "sees every process of your user and can read their environments and memory; `amb doctor` says "
        "what to change (--isolation required refuses to run so)"
    ], proc.stderr
    started = next(e.payload for e in _events(store, run) if e.kind == "run.started")
    assert (started.isolation.kind, started.isolation.requested) == ("none", "best-effort")
    assert started.isolation.reason == "`unshare` (util-linux) is not on PATH"
    assert (ws / "parent.txt").read_text() == "amb-record"  # it does see amb-record: not isolated
    (ws / "parent.txt").unlink()

    proc, store, ws, run = _plain_run(tmp_path, ["--isolation", "required"], PARENT, PATH=path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "amb-record: error: --isolation required: this system cannot hide the other processes from a "
        "local agent (`unshare` (util-linux) is not on PATH); `amb doctor` says what to change, or use "
        "--backend docker"
    ], proc.stderr
    assert not (ws / "parent.txt").exists()  # the agent never ran
    spool = spool_path(store, run, "recorder")
    assert not spool.exists() or _events(store, run) == []  # nothing was recorded


def test_where_the_kernel_refuses_user_namespaces_the_run_says_so(tmp_path):
    # A user namespace of the test's in which no further user namespace may be made: what
    # user.max_user_namespaces = 0 does on a host, or a container's policy.
    limit = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    deny = ("unshare", "--user", "--map-root-user", "sh", "-c", limit, "sh")
    proc, store, ws, run = _plain_run(tmp_path, [], PARENT, wrap=deny, PATH=os.environ["PATH"])
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "not isolated" in line]
    assert len(said) == 1 and "No space left on device" in said[0], proc.stderr
    started = next(e.payload for e in _events(store, run) if e.kind == "run.started")
    assert started.isolation.kind == "none" and "No space left on device" in started.isolation.reason
    assert (ws / "parent.txt").read_text() == "amb-record"


def test_stdin_and_a_terminal_reach_the_isolated_agent(tmp_path):
    agent = (
        "import os, sys; open('got.txt', 'w').write(sys.stdin.read()); "
        "open('tty.txt', 'w').write(str(os.isatty(1)))"
    )
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    argv = [AMB_RECORD, "--store", str(store), "--isolation", "required", "--", sys.executable, "-c", agent]
    parent, child = pty.openpty()
    try:
        proc = subprocess.run(
            argv, cwd=ws, input=b"through the namespace\n", stdout=child, stderr=subprocess.PIPE
        )
    finally:
        os.close(child)
        os.close(parent)
    assert proc.returncode == 0, proc.stderr
    assert (ws / "got.txt").read_text() == "through the namespace\n"
    assert (ws / "tty.txt").read_text() == "True"


def test_a_killed_recorder_takes_the_whole_agent_tree_with_it(tmp_path, gc_alone):
    # A child that left the agent's session (setsid) is out of reach of its process group and of
    # the parent-death signal; the end of the PID namespace still takes it.
    nap = f"1000.{secrets.randbelow(10**9)}"
    agent = f"setsid sleep {nap} & sleep {nap} & echo up > up.txt; wait"
    store, ws, tmp = tmp_path / "store", tmp_path / "ws", tmp_path / "tmp"
    ws.mkdir()
    tmp.mkdir()
    argv = [AMB_RECORD, "--store", str(store), "--no-ingest", "--", "sh", "-c", agent]
    proc = subprocess.Popen(argv, cwd=ws, env={**os.environ, "TMPDIR": str(tmp)}, stderr=subprocess.DEVNULL)
    try:
        # up.txt is written once both are forked; each is a sleep once it has exec'd.
        deadline = time.monotonic() + 60
        while len(running_with(f"sleep\0{nap}".encode())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (ws / "up.txt").exists() and len(running_with(f"sleep\0{nap}".encode())) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while running_with(f"sleep\0{nap}".encode()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running_with(f"sleep\0{nap}".encode()) == []
    finally:
        if proc.poll() is None:  # (a failed check above: the recorder is not left running)
            proc.kill()
            proc.wait()
        for pid in running_with(f"sleep\0{nap}".encode()):
            os.kill(pid, signal.SIGKILL)
        subprocess.run([str(BIN / "amb"), "gc"], env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True)


def test_docker_takes_no_isolation_option(tmp_path):
    proc, _, _, _ = _plain_run(tmp_path, ["--backend", "docker", "--isolation", "off"], "pass", PATH=str(BIN))
    assert proc.returncode == 2 and "--isolation is for the local backend" in proc.stderr, proc.stderr
