"""``amb serve`` and ``amb replay serve`` as a user starts them: loopback by default, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from recorder.synthetic import generate_run
from replay.ingest import ingest

BIN = Path(sys.executable).parent


def amb(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "amb"), *args], capture_output=True, text=True, timeout=timeout)


def small_store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    generate_run(root, "r-1", seed=1, calls=3)
    ingest(root)
    return root


def test_serve_listens_on_loopback_and_answers(tmp_path):
    root = small_store(tmp_path)
    proc = subprocess.Popen(
        [str(BIN / "amb"), "serve", "--store", str(root), "--port", "0"], stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "http://127.0.0.1:" in line, line
        url = line.split("at ", 1)[1].split("/ ", 1)[0]
        with urllib.request.urlopen(url + "/api/runs", timeout=30) as r:
            assert [x["run_id"] for x in json.loads(r.read())["runs"]] == ["r-1"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_refuses_a_non_loopback_host_unless_asked(tmp_path):
    root = small_store(tmp_path)
    r = amb("serve", "--store", str(root), "--host", "192.0.2.1")
    assert r.returncode == 2 and "--allow-remote" in r.stderr and "Traceback" not in r.stderr
    # Asked for: the warning comes first (192.0.2.1 is a documentation address: the bind fails).
    r = amb("serve", "--store", str(root), "--host", "192.0.2.1", "--allow-remote", "--port", "0")
    assert "warning: serving on 192.0.2.1" in r.stderr and "no login" in r.stderr
    assert r.returncode != 0 and "amb: error: cannot listen on 192.0.2.1" in r.stderr


def test_serve_and_replay_name_what_is_missing(tmp_path):
    r = amb("serve", "--store", str(tmp_path / "nothing"))
    assert r.returncode != 0 and "no store at" in r.stderr and "Traceback" not in r.stderr
    root = small_store(tmp_path)
    r = amb("replay", "serve", "no-such-run", "--store", str(root))
    assert r.returncode == 3 and "no run 'no-such-run'" in r.stderr and "Traceback" not in r.stderr


def test_replay_serve_answers_until_stopped(tmp_path):
    root = small_store(tmp_path)
    proc = subprocess.Popen(
        [str(BIN / "amb"), "replay", "serve", "r-1", "--store", str(root), "--match", "sequence"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving 3 recorded calls of r-1 (sequence, fast timing)" in line, line
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        req = urllib.request.Request(
            url + "/v1/chat/completions",
            data=json.dumps({"model": "x", "messages": [], "stream": True}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.headers["x-amb-replay"] == "sequence" and r.headers["x-amb-replay-call"] == "proxy:0"
            body = r.read()
        assert json.loads(body)["id"] == "r-1-c000"  # the recorded response of the run's first call
        assert "request 1 (chat.completions): served proxy:0 (sequence)" in proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_port_out_of_range_is_one_usage_error(tmp_path):
    root = small_store(tmp_path)
    for args in (["serve", "--port", "70000"], ["replay", "serve", "r-1", "--port", "-1"]):
        proc = amb(*args, "--store", str(root))
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("amb: error: Invalid value for '--port'") and "0<=x<=65535" in line, line
