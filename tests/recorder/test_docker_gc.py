"""Crash hygiene: after ``kill -9`` of ``amb-record --backend docker`` and of its watchdog mid-run (a
whole job killed at once), ``amb gc`` removes that run's container, network, host firewall rules and
temp dirs (workspace, CA key), says so, and does not touch a run that is still recording.

Needs dockerd (CI starts it with .ci/dockerd.sh); never skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.fakes.upstream import FakeUpstream

BIN = Path(sys.executable).parent

pytestmark = pytest.mark.usefixtures("gc_alone")  # no other test's `amb gc` meanwhile (tests/conftest.py)


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
    containers = client.containers.list(
        all=True, filters={"label": f"org.amb.run={run_id}"}, ignore_removed=True
    )
    networks = client.networks.list(filters={"label": f"org.amb.run={run_id}"})
    rules = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True).stdout
    return {
        "containers": sorted(c.name for c in containers),
        "running": [c.name for c in containers if c.status == "running"],
        "networks": sorted(n.name for n in networks),
        "rules": [line for line in rules.splitlines() if f"amb-run:{run_id}" in line],
        "paths": sorted(str(p) for p in tmp.glob(f"amb-*{run_id}-*")),
    }


def lock_info(tmp: Path, run_id: str) -> dict:
    """What the run's lock holds (its recorder's pid, its watchdog's, its local agent's group)."""
    try:
        return json.loads((tmp / "amb-runs" / f"{run_id}.lock").read_text())
    except (OSError, ValueError):
        return {}


def kill_with_watchdog(proc: subprocess.Popen, tmp: Path, run_id: str) -> None:
    """SIGKILL to the recorder's watchdog (its lock names it), then to the recorder: what a job's
    kill does to both."""
    watchdog = lock_info(tmp, run_id).get("watchdog")
    if watchdog is not None:
        os.kill(watchdog, signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def in_dir(directory: Path) -> list[int]:
    """The live processes whose working directory is ``directory`` (an agent in its workspace)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd") == str(directory):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def pgid_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])


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
            kill_with_watchdog(dead, tmp, dead_id)
            time.sleep(0.5)
            assert _resources(docker_cli, dead_id, tmp)["containers"] == before["containers"]  # left behind

            proc = subprocess.run(
                [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=180, env=env
            )
            assert proc.returncode == 0, proc.stderr
            removed = json.loads(proc.stdout)["removed"]
            mine = {(r["kind"], r["name"]) for r in removed if r["run_id"] == dead_id}
            assert {n for k, n in mine if k == "container"} == set(before["containers"]), proc.stdout
            assert {n for k, n in mine if k == "network"} == set(before["networks"]), proc.stdout
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
        # Started: each recorder has its agent running (the only process in the workspace but the
        # recorders), and its signal handlers set.
        while len(in_dir(ws)) < 2 * len(runs):
            assert time.monotonic() < deadline, "the recorders did not start their agents"
            time.sleep(0.2)
        time.sleep(0.5)
        dead_id, dead = runs["dead"]
        live_id, live = runs["live"]
        dead_dirs = sorted(str(p) for p in tmp.glob(f"amb-{dead_id}-*"))
        live_dirs = sorted(str(p) for p in tmp.glob(f"amb-{live_id}-*"))
        kill_with_watchdog(dead, tmp, dead_id)
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
        assert not docker_cli.containers.list(
            all=True, filters={"label": f"org.amb.run={run_id}"}, ignore_removed=True
        )
    finally:
        for c in docker_cli.containers.list(
            all=True, filters={"label": f"org.amb.run={run_id}"}, ignore_removed=True
        ):
            c.remove(force=True)


def _amb_entries(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("amb"))


def _assert_recorded_unfinished(store: Path, run_id: str) -> None:
    """The spool is the record, untouched: ingest takes the run in as unfinished, and it verifies."""
    amb = str(BIN / "amb")
    ingest = subprocess.run(
        [amb, "ingest", "--store", str(store)], capture_output=True, text=True, timeout=120
    )
    assert ingest.returncode == 0, ingest.stderr
    runs = subprocess.run(
        [amb, "runs", "--store", str(store), "--json"], capture_output=True, text=True, timeout=60
    )
    assert {r["run_id"]: r["status"] for r in json.loads(runs.stdout)} == {run_id: "unfinished"}, runs.stdout
    verify = subprocess.run([amb, "verify", "--store", str(store), run_id], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_watchdog_removes_what_a_killed_docker_recorder_left_within_10s(
    tmp_path: Path, agent_image: str, docker_cli
) -> None:
    store = tmp_path / "store"
    run_id = f"wd-docker-{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="amb-wd-"))  # its own lock directory: no other gc reaches it
    empty: dict[str, list[str]] = {"containers": [], "running": [], "networks": [], "rules": [], "paths": []}
    with FakeUpstream() as upstream:
        proc = _start(store, run_id, upstream.url, tmp)
        try:
            before = _wait_running(docker_cli, proc, run_id, tmp)
            assert len(before["containers"]) == 1 and len(before["networks"]) == 1
            assert len(before["rules"]) >= 3 and len(before["paths"]) == 2, before
            proc.send_signal(signal.SIGKILL)  # amb-record alone: the OOM killer, a stray kill
            proc.wait(10)
            deadline = time.monotonic() + 10
            while (left := (_resources(docker_cli, run_id, tmp), _amb_entries(tmp))) != (empty, []):
                assert time.monotonic() < deadline, f"10 s after kill -9, left: {left}"
                time.sleep(0.1)
            assert proc.stderr is not None
            said = proc.stderr.read()  # the watchdog's line (it holds amb-record's stderr until it ends)
            assert f"amb-record: watchdog: run {run_id}'s amb-record is gone; removed container" in said, said
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            subprocess.run(
                [str(BIN / "amb"), "gc"],
                capture_output=True,
                timeout=180,
                env={**os.environ, "TMPDIR": str(tmp)},
            )
            shutil.rmtree(tmp, ignore_errors=True)
    _assert_recorded_unfinished(store, run_id)


def _group(pgid: int) -> list[int]:
    """The live processes of a process group."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            out.append(int(proc.name))
    return out


@pytest.mark.parametrize("shim", [False, True], ids=["plain-killed-alone", "shim-killed-with-its-group"])
def test_the_watchdog_cleans_up_after_a_killed_local_recorder(tmp_path: Path, shim: bool) -> None:
    """kill -9 of amb-record alone, or (with the shim) of its whole process group: the watchdog is in
    neither group and cleans up."""
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    run_id = f"wd-local-{'shim' if shim else 'plain'}-{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="amb-wdl-"))
    # A background child of the agent: the parent-death signal reaches the agent alone, not it.
    agent = ["sh", "-c", "sleep 600 & echo $! > bg.pid; exec sleep 601"]
    proc = subprocess.Popen(
        # Not isolated: the group kill is what the watchdog does for an agent sharing the host's
        # processes (an isolated agent's namespace ends with amb-record: test_local_isolation.py).
        [str(BIN / "amb-record"), "--store", str(store), "--run-id", run_id, "--isolation", "off"]
        + [*(["--shim"] if shim else []), "--", *agent],
        cwd=ws,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a shell gives a command
    )
    try:
        deadline = time.monotonic() + 120
        while not (ws / "bg.pid").exists() or not (ws / "bg.pid").read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None, "the agent did not start"
            time.sleep(0.1)
        pgid = pgid_of(int((ws / "bg.pid").read_text()))
        made = _amb_entries(tmp)
        assert any(n.startswith(f"amb-{run_id}-") for n in made) and "amb-runs" in made, made
        assert any(n.startswith("amb-shim-sock-") for n in made) == shim, made
        if shim:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while (left := (_amb_entries(tmp), _group(pgid))) != ([], []):
            assert time.monotonic() < deadline, f"10 s after kill -9, left: {left}"
            time.sleep(0.1)
        assert proc.stderr is not None
        assert f"removed process_group {pgid}, " in proc.stderr.read()
        assert (ws / "bg.pid").exists()  # the workspace is the user's directory: it stays
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    _assert_recorded_unfinished(store, run_id)


def _exec_spec(tmp_path: Path, repeat: int) -> tuple[Path, str]:
    from sweeps.spec import load

    spec = tmp_path / f"spec-{repeat}.json"
    cell = {"sweep": "gcs", "agent": "a", "task": "bccd-det", "tier": "lite", "repeat": repeat}
    spec.write_text(
        json.dumps(
            {
                "cell": cell,
                "attempt": 1,
                "agent": {"name": "a", "command": ["sleep", "600"]},
                "limits": {"time_limit_s": 600},
                "backend": "local",
                "data": str(tmp_path),
                "shard_root": str(tmp_path / "root"),
            }
        )
    )
    return spec, load(spec).run_id


def test_gc_removes_a_killed_sweep_executions_workspace_and_spares_a_live_one(tmp_path: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="amb-gcs-"))
    env = {**os.environ, "TMPDIR": str(tmp)}
    execs = {}
    for repeat in (1, 2):
        spec, run_id = _exec_spec(tmp_path, repeat)
        execs[run_id] = subprocess.Popen(
            [str(BIN / "amb"), "sweep", "exec", str(spec)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    (dead_id, dead), (live_id, live) = execs.items()
    try:
        deadline = time.monotonic() + 120
        while not all(
            len(ws) == 1 and in_dir(ws[0]) for ws in (sorted(tmp.glob(f"amb-ws-{r}-*")) for r in execs)
        ):
            assert time.monotonic() < deadline, "the executions did not start their agents"
            time.sleep(0.2)
        dead_ws, live_ws = (sorted(tmp.glob(f"amb-ws-{r}-*")) for r in (dead_id, live_id))
        agents = pgid_of(in_dir(dead_ws[0])[0])
        # The whole job at once: no `finally`, no watchdog, no agent (a cgroup's kill).
        kill_with_watchdog(dead, tmp, dead_id)
        os.killpg(agents, signal.SIGKILL)
        assert dead_ws[0].exists()
        proc = subprocess.run(
            [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, proc.stderr
        removed = {(r["run_id"], r["kind"], r["name"]) for r in json.loads(proc.stdout)["removed"]}
        assert (None, "path", str(dead_ws[0])) in removed, removed  # the execution's own, of no run
        run_dir = str(tmp / f"amb-{dead_id}-")
        assert any(r[:2] == (dead_id, "path") and r[2].startswith(run_dir) for r in removed), removed
        assert not [r for r in removed if r[0] == live_id or live_ws[0].name in r[2]], removed
        assert not dead_ws[0].exists() and live_ws[0].exists()
        assert lock_info(tmp, live_id)["run_id"] == live_id
        live.send_signal(signal.SIGTERM)
        assert live.wait(60) == 0
        assert not live_ws[0].exists()
    finally:
        for p in execs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        subprocess.run([str(BIN / "amb"), "gc"], capture_output=True, timeout=120, env=env)
        shutil.rmtree(tmp, ignore_errors=True)


def test_gc_reports_what_it_removed_and_goes_on_past_what_resists(agent_image: str, docker_cli) -> None:
    """A dead run's network that cannot go (a container that is not amb's is still on it) is one
    problem, named; the run's container removed before it is still reported as removed."""
    stamp = str(os.getpid())
    run_id = f"gc-resists-{stamp}"
    tmp = Path(tempfile.mkdtemp(prefix="amb-gcr-"))
    env = {**os.environ, "TMPDIR": str(tmp)}
    lock = tmp / "amb-runs" / f"{run_id}.lock"
    lock.parent.mkdir(mode=0o1777)
    # A run lock nobody holds: its recorder is gone.
    lock.write_text(json.dumps({"run_id": run_id, "backend": "docker", "paths": []}))
    labels = {"org.amb.run": run_id, "org.amb.lock": str(lock)}
    network = docker_cli.networks.create(f"amb-net-{run_id}", labels=labels)
    made = [
        docker_cli.containers.create(agent_image, ["sleep", "300"], name=f"amb-{run_id}", labels=labels),
        docker_cli.containers.run(
            agent_image, ["sleep", "300"], name=f"bystander-{stamp}", network=network.name, detach=True
        ),
    ]
    try:
        proc = subprocess.run(
            [str(BIN / "amb"), "gc", "--json"], capture_output=True, text=True, timeout=180, env=env
        )
        assert proc.returncode == 0, proc.stderr
        said = json.loads(proc.stdout)
        mine = [(r["kind"], r["name"]) for r in said["removed"] if r["run_id"] == run_id]
        assert ("container", f"amb-{run_id}") in mine and ("network", network.name) not in mine, said
        assert [p for p in said["problems"] if p.startswith(f"network {network.name}: could not be removed")]
        assert docker_cli.containers.get(f"bystander-{stamp}").status == "running"
    finally:
        for container in made:
            with contextlib.suppress(Exception):
                container.remove(force=True)
        with contextlib.suppress(Exception):
            network.remove()
        shutil.rmtree(tmp, ignore_errors=True)
