"""Crash hygiene: after ``kill -9`` of ``amb-record --backend docker`` mid-run, ``amb gc`` removes that
run's container, network, host firewall rules and temp dirs (workspace, CA key), says so, and does not
touch a run that is still recording.

Needs dockerd (CI starts it with .ci/dockerd.sh); never skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fakes.upstream import FakeUpstream

BIN = Path(sys.executable).parent


def _start(store: Path, run_id: str, upstream: str, tmp: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(BIN / "amb-record"),
            "--store",
            str(store),
            "--backend",
            "docker",
            "--run-id",
            run_id,
            "--upstream",
            f"openai={upstream}",
            "--",
            "sleep",
            "600",
        ],
        env={**os.environ, "OPENAI_API_KEY": "sk-gc-test-" + "ab" * 20, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _resources(client, run_id: str, tmp: Path) -> dict:
    containers = client.containers.list(all=True, filters={"label": f"org.amb.run={run_id}"})
    networks = client.networks.list(filters={"label": f"org.amb.run={run_id}"})
    rules = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True).stdout
    return {
        "containers": sorted(c.name for c in containers),
        "running": [c.name for c in containers if c.status == "running"],
        "networks": sorted(n.name for n in networks),
        "rules": [line for line in rules.splitlines() if f"amb-run:{run_id}" in line],
        "paths": sorted(str(p) for p in tmp.glob(f"amb-*{run_id}-*")),
    }


def _wait_running(client, proc: subprocess.Popen, run_id: str, tmp: Path) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = _resources(client, run_id, tmp)
        if got["running"]:
            return got
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.3)
    raise AssertionError(f"run {run_id}: no running container after 120 s")


def test_gc_removes_a_killed_recorders_leftovers_and_spares_a_live_run(
    tmp_path: Path,
    agent_image: str,
    docker_cli,
) -> None:
    store = tmp_path / "store"
    stamp = str(os.getpid())
    dead_id, live_id = f"gc-dead-{stamp}", f"gc-live-{stamp}"
    # A temp dir of this test's own (where run locks live): every amb-record cleans up after dead
    # recorders when it starts, so one starting beside this test (another test process) would
    # otherwise remove the killed run's leftovers before `amb gc` is shown to. Short: sockets go there.
    tmp = Path(tempfile.mkdtemp(prefix="amb-gc-"))
    env = {**os.environ, "TMPDIR": str(tmp)}
    with FakeUpstream() as upstream:
        dead = _start(store, dead_id, upstream.url, tmp)
        live = _start(store, live_id, upstream.url, tmp)
        try:
            before = _wait_running(docker_cli, dead, dead_id, tmp)
            live_before = _wait_running(docker_cli, live, live_id, tmp)
            # What a run makes: one container, one network, the firewall rules (root with iptables),
            # the docker backend's temp dir (workspace) and the recorder's (CA key).
            assert len(before["containers"]) == 1 and len(before["networks"]) == 1
            assert len(before["rules"]) >= 3 and len(before["paths"]) == 2, before
            dead.send_signal(signal.SIGKILL)
            dead.wait(10)
            time.sleep(0.5)
            assert _resources(docker_cli, dead_id, tmp)["containers"] == before["containers"]  # left behind

            proc = subprocess.run(
                [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=180, env=env
            )
            assert proc.returncode == 0, proc.stderr
            removed = json.loads(proc.stdout)["removed"]
            mine = {(r["kind"], r["name"]) for r in removed if r["run_id"] == dead_id}
            assert {n for k, n in mine if k == "container"} == set(before["containers"])
            assert {n for k, n in mine if k == "network"} == set(before["networks"])
            # The recorder's own temp dir (CA key) may already be gone: any amb-record that starts on
            # this machine also sweeps the temp dirs of dead recorders. The workspace is gc's alone.
            paths = {n for k, n in mine if k == "path"}
            assert paths <= set(before["paths"]) and any("/amb-docker-" in p for p in paths), mine
            assert len([n for k, n in mine if k == "firewall_rule"]) == len(before["rules"])
            assert not [r for r in removed if r["run_id"] == live_id]
            after = _resources(docker_cli, dead_id, tmp)
            assert after == {"containers": [], "running": [], "networks": [], "rules": [], "paths": []}
            # The live run is untouched, and still records to the end.
            assert _resources(docker_cli, live_id, tmp) == live_before
            live.send_signal(signal.SIGTERM)
            assert live.wait(60) != 0
            assert _resources(docker_cli, live_id, tmp) == {
                "containers": [],
                "running": [],
                "networks": [],
                "rules": [],
                "paths": [],
            }
        finally:
            for p in (dead, live):
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            subprocess.run([str(BIN / "amb"), "gc"], capture_output=True, timeout=180, env=env)
            shutil.rmtree(tmp, ignore_errors=True)


def _children(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().strip()
    except OSError:
        return ""


def test_gc_after_a_killed_local_recorder_removes_its_temp_dir_not_a_live_ones(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ws = tmp_path / "ws"
    ws.mkdir()
    stamp = str(os.getpid())
    # A temp dir (and so a lock directory) of this test's own: any amb-record that starts beside it
    # (another test process) sweeps dead recorders of its temp dir, and would take the killed run's
    # lock and dirs before `amb gc` is shown to (it did, on CI). Short: sockets go there.
    tmp = Path(tempfile.mkdtemp(prefix="amb-gcl-"))
    env = {**os.environ, "TMPDIR": str(tmp)}
    runs = {}
    for name in ("dead", "live"):
        run_id = f"gc-local-{name}-{stamp}"
        runs[name] = (
            run_id,
            subprocess.Popen(
                [str(BIN / "amb-record"), "--store", str(store), "--run-id", run_id, "--", "sleep", "600"],
                cwd=ws,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        )
    try:
        deadline = time.monotonic() + 120
        # Started: each recorder has its agent (its child) running, and its signal handlers set.
        while not all(_children(p.pid) for _, p in runs.values()):
            assert time.monotonic() < deadline, "the recorders did not start their agents"
            time.sleep(0.2)
        time.sleep(0.5)
        dead_id, dead = runs["dead"]
        live_id, live = runs["live"]
        dead_dirs = sorted(str(p) for p in tmp.glob(f"amb-{dead_id}-*"))
        live_dirs = sorted(str(p) for p in tmp.glob(f"amb-{live_id}-*"))
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
        proc = subprocess.run(
            [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, proc.stderr
        removed = json.loads(proc.stdout)["removed"]
        paths = {r["name"] for r in removed if r["run_id"] == dead_id and r["kind"] == "path"}
        assert dead_dirs and paths == set(dead_dirs)
        assert any(r["run_id"] == dead_id and r["kind"] == "lock" for r in removed)
        assert not [r for r in removed if r["run_id"] == live_id]
        assert not any(Path(p).exists() for p in dead_dirs)
        assert all(Path(p).exists() for p in live_dirs)
        live.send_signal(signal.SIGTERM)
        live.wait(60)
        assert not any(Path(p).exists() for p in live_dirs)  # a clean end removes its own
    finally:
        for _, p in runs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        subprocess.run([str(BIN / "amb"), "gc"], capture_output=True, timeout=120, env=env)
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_recorder_starting_cleans_up_only_after_recorders_of_its_own_temp_dir(
    tmp_path: Path, agent_image: str, docker_cli, monkeypatch
) -> None:
    """amb-record at start (``everywhere=False``) leaves a dead recorder's container alone when that
    recorder used another temp dir; ``amb gc`` (``everywhere=True``) removes it."""
    from recorder.gc import collect

    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    ours.mkdir()
    run_id = f"gc-scope-{os.getpid()}"
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer names a live process (its start time cannot match)
    container = docker_cli.containers.create(
        agent_image,
        ["true"],
        name=f"amb-{run_id}",
        labels={
            "org.amb.run": run_id,
            "org.amb.lock": str(theirs / "amb-runs" / f"{run_id}.lock"),
            "org.amb.pid": str(dead.pid),
            "org.amb.pid_start": "1",
        },
    )
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(ours))  # this process's lock directory
        removed, problems = collect(docker=True, client=docker_cli, everywhere=False)
        assert not problems and run_id not in {r.run_id for r in removed}
        container.reload()  # still there (raises NotFound otherwise)

        removed, problems = collect(docker=True, client=docker_cli, everywhere=True)
        assert not problems
        assert ("container", f"amb-{run_id}") in {(r.kind, r.name) for r in removed if r.run_id == run_id}
        assert not docker_cli.containers.list(all=True, filters={"label": f"org.amb.run={run_id}"})
    finally:
        for c in docker_cli.containers.list(all=True, filters={"label": f"org.amb.run={run_id}"}):
            c.remove(force=True)
