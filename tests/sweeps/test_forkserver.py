"""The warm exec (``amb sweep exec --serve``, sweeps/forkserver.py) behaves as the cold command does.

Every local sweep in tests/sweeps runs its execs through it (recorded runs, cancel, kill -9 of the
sweep, resume); here: the same error line and exit status as a cold ``amb sweep exec`` for a spec it
cannot run, the environment a request adds, and the server's end when its input closes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sweeps.forkserver import ExecServer, Forked

AMB = str(Path(sys.executable).with_name("amb"))


def test_a_forked_exec_fails_as_the_cold_command_does(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"cell": 1}')
    cold = subprocess.run([AMB, "sweep", "exec", str(bad)], capture_output=True, text=True, timeout=300)
    assert cold.returncode == 2 and cold.stderr.startswith("amb: error: "), cold.stderr

    server = ExecServer(tmp_path / "server.log")
    try:
        assert server.wait_ready() is not None, (tmp_path / "server.log").read_text()
        log = tmp_path / "bad.log"
        pid = server.start(bad, log, {"AMB_CPUS": "1"})
        assert pid is not None
        assert Forked(server, pid).wait(120) == cold.returncode
        assert log.read_text() == cold.stderr
    finally:
        server.close()
    assert server.proc.wait(30) == 0  # its input closed and its child gone: it ends by itself


def test_a_request_adds_to_the_childs_environment(tmp_path):
    # A run that needs two GPUs where the allocation names one: the exec refuses it, naming the
    # variable and the value it read, which only the request's environment holds.
    spec = tmp_path / "gpu.json"
    spec.write_text(
        '{"cell": {"sweep": "s", "agent": "a", "task": "bccd-det", "tier": "lite", "repeat": 1},'
        ' "attempt": 1, "agent": {"name": "a", "command": ["true"]},'
        ' "limits": {"time_limit_s": 60, "gpus": 2}, "backend": "docker",'
        f' "data": "{tmp_path}", "shard_root": "{tmp_path / "root"}"}}'
    )
    server = ExecServer(tmp_path / "server.log")
    try:
        assert server.wait_ready() is not None
        pid = server.start(spec, tmp_path / "gpu.log", {"AMB_GPU_IDS": "7"})
        assert pid is not None and Forked(server, pid).wait(120) == 2
    finally:
        server.close()
    assert "needs 2 GPU(s); the allocation has AMB_GPU_IDS='7'" in (tmp_path / "gpu.log").read_text()


def test_the_server_reads_requests_on_a_descriptor_past_1023(tmp_path):
    """Its input may be any descriptor (a process holding many files hands out high numbers): waiting
    on it by poll, the server answers as on descriptor 0, where select() refused anything past 1,023."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"cell": 1}')
    log = tmp_path / "bad.log"
    server = (
        "import os, resource, sys\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "if soft < 2048:\n"
        "    resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))\n"
        "from sweeps.forkserver import serve\n"
        "os.dup2(0, 1500)\n"
        "sys.exit(serve(1500, 1))\n"
    )
    request = json.dumps({"spec": str(bad), "log": str(log)}) + "\n"
    proc = subprocess.run(
        [sys.executable, "-c", server],
        input=request,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    said = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [sorted(m) for m in said] == [["ready"], ["pid", "spec"], ["exit", "pid"]], said
    assert said[2] == {"pid": said[1]["pid"], "exit": 2}
    assert log.read_text().startswith("amb: error: ")
