"""Key custody in the local backend: an agent running as the same (unprivileged) user as amb-record,
not isolated from it (``--isolation off``), tries every way to the real key and finds none.

The tests run as root, and root reads any process's memory whatever the process does, so
amb-record itself is started as ``nobody`` (``setpriv``) and the agent, its child, is ``nobody``
too. The agent tries amb-record's ``/proc/<pid>/environ``, ``mem`` (every readable mapping),
``cmdline``, ``ptrace`` attach and ``process_vm_readv``, every process's environment it can read,
and every file it can read under amb-record's temp dir, the store and the workspace. As controls it must
find the placeholder key in its own environment and in its own memory by the same ``mem`` reader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fakes.harness import REAL_KEYS
from tests.fakes.upstream import FakeUpstream
from tests.recorder.ordinary_user import require_reachable_checkout

BIN = Path(sys.executable).parent
NOBODY = 65534

THIEF = r"""
import ctypes, json, os, re, sys
keys = [k[::-1].encode() for k in json.loads(sys.argv[1])]  # reversed: argv is readable too
found = {}
def note(channel, data, where):
    for k in keys:
        if k in data:
            found.setdefault(channel, []).append(where)
def read(path):
    with open(path, "rb") as f:
        return f.read()
def read_mem(pid):
    maps = read(f"/proc/{pid}/maps").decode().splitlines()
    out = []
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if "r" not in line.split()[1] or hi - lo > 1 << 28:
                continue
            try:
                mem.seek(lo); out.append(mem.read(hi - lo))
            except OSError:
                pass
    return b"".join(out)
target = os.getppid()  # amb-record
tried = {}
for channel, fn in (
    ("environ", lambda: read(f"/proc/{target}/environ")),
    ("cmdline", lambda: read(f"/proc/{target}/cmdline")),
    ("mem", lambda: read_mem(target)),
):
    try:
        data = fn(); tried[channel] = "read"; note(channel, data, target)
    except OSError as e:
        tried[channel] = f"refused: {e.strerror}"
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(16, target, None, None) == 0:  # PTRACE_ATTACH
    tried["ptrace"] = "attached"
    os.waitpid(target, 0x40000000)  # __WALL: wait for the attach stop, or the detach fails
    libc.ptrace(17, target, None, None)  # PTRACE_DETACH: let amb-record run on
else:
    tried["ptrace"] = f"refused: {os.strerror(ctypes.get_errno())}"
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(4096)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 4096)
try:
    lo = int(read(f"/proc/{target}/maps").split(b"-")[0], 16)
except OSError:
    lo = 0x400000
remote = iovec(lo, 4096)
n = libc.process_vm_readv(target, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
tried["process_vm_readv"] = "read" if n > 0 else f"refused: {os.strerror(ctypes.get_errno())}"
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        note("other_environ", read(f"/proc/{pid}/environ"), int(pid))
    except OSError:
        pass
for root in sys.argv[2:]:
    for d, _, files in os.walk(root):
        for name in files:
            try:
                note("files", read(os.path.join(d, name))[: 64 << 20], os.path.join(d, name))
            except OSError:
                pass
own_mem = read_mem(os.getpid())
json.dump({"found": found, "tried": tried,
           "control_env": os.environ["OPENAI_API_KEY"].startswith("amb-placeholder-"),
           "control_mem": os.environ["OPENAI_API_KEY"].encode() in own_mem}, open("thief.json", "w"))
"""


def _python_for(uid: int) -> str:
    """A python3 that ``uid`` can run (the project's may live under root's home, closed to it)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        # Through a shell already running as uid: no root capability helps that exec along.
        probe = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/bin/sh", "-c"]
        if subprocess.run([*probe, f"exec '{candidate}' -c pass"], capture_output=True).returncode == 0:
            return candidate
    raise AssertionError(f"no python3 that uid {uid} may run")


@pytest.fixture
def nobody_dir():
    d = Path(tempfile.mkdtemp(prefix="amb-custody-"))
    os.chown(d, NOBODY, NOBODY)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def test_a_same_user_agent_cannot_read_the_real_key(nobody_dir):
    require_reachable_checkout()
    store, ws, home = nobody_dir / "store", nobody_dir / "ws", nobody_dir / "home"
    for d in (ws, home):
        d.mkdir()
        os.chown(d, NOBODY, NOBODY)
    (ws / "thief.py").write_text(THIEF)
    keys = list(REAL_KEYS.values())
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "TMPDIR": str(nobody_dir),
        **REAL_KEYS,
    }
    with FakeUpstream() as fake:
        cmd = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "--inh-caps=-all",
            str(BIN / "amb-record"),
            "--store",
            str(store),
            "--upstream",
            f"openai={fake.url}",
            "--upstream",
            f"anthropic={fake.url}",
            # amb-record's own seal is under test, the defence left where the agent cannot be isolated
            # (test_local_isolation.py): isolated, the agent could not even name amb-record.
            "--isolation",
            "off",
            "--",
            _python_for(NOBODY),
            "thief.py",
            json.dumps([k[::-1] for k in keys]),
            str(nobody_dir),  # amb-record's temp dir (TMPDIR), the store and the workspace
        ]
        res = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads((ws / "thief.json").read_text())
    assert out["control_env"] and out["control_mem"], out  # the agent's probes do work
    assert out["found"] == {}, out
    tried = out["tried"]
    assert tried["environ"].startswith("refused") and tried["mem"].startswith("refused"), tried
    assert tried["ptrace"].startswith("refused") and tried["process_vm_readv"].startswith("refused"), tried
    assert tried["cmdline"] == "read"  # readable by anyone: it must simply never hold a key
    # What stays open without root is said at start.
    assert "amb-record: warning: the local agent runs as your user" in res.stderr
    assert "--backend docker" in res.stderr
