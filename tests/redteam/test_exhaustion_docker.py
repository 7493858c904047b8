"""Red team, docker backend: an agent that exhausts its container ends the same way every time.

The agent (``exhaust_agent.py``) writes a 1.2 GB file in the workspace, /tmp and /dev/shm, 5,200 small
files, tries to make itself immune to the OOM killer, takes every pid with a thread bomb and makes a
blocking connect while no pid is left, then does normal work: a model call through the recording proxy
against the loopback fake, a shell command, its submission, exit 0. Run several times (twice; five times
under ``AMB_SOAK=1``, tests/soak.py), each run ends ``completed`` with every fact recorded: the connect
made while the shim could not start a thread, the model call after the bombs, and the submission, which
the 5,200 files must not push out of the sealed listing. The shim runs in the agent's container and
shares its limits; it starts every thread it needs before the agent.

With ``memory`` the agent leaves the disk and the files alone and fills the memory with many small
processes until the kernel's OOM killer kills one. The OOM killer takes the largest process, and that
may be the recorder's shim or one of the agent's, by a few megabytes, depending on the moment: so the
first OOM kill ends the run, whichever it took, and the run says so in the same words each time.

ContainerResources are smaller than the defaults so that a run takes seconds. Needs dockerd; never skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from recorder.docker_backend import ContainerResources, DockerBackend, DockerBackendError
from recorder.run import Outcome, RunSpec, record
from replay.ingest import ingest
from replay.store import Store
from tests.fakes.upstream import TEXT, FakeUpstream
from tests.recorder.shim_helpers import payloads, shim_events
from tests.scan_checks import assert_audit_scan_agrees
from tests.soak import soak

pytestmark = pytest.mark.long(minutes=4)  # minutes: docker runs that fill disk, pids and memory

AGENT = Path(__file__).with_name("exhaust_agent.py")
AMB = [str(Path(sys.executable).parent / "amb")]
WORK_LIMITS = ContainerResources(cpus=2.0, memory="4g", pids=1024, tmp_size="512m")
MEMORY_LIMITS = ContainerResources(cpus=2.0, memory="2g", pids=512, tmp_size="256m")
"""The tmpfs mounts (/tmp, /home/agent, /dev/shm) stay well under the memory limit: what the agent
leaves in them is not freed by killing it."""
OUT_OF_MEMORY = (
    "the container ran out of memory (limit 2g): the kernel's OOM killer killed a process, "
    "and the run was stopped there (the recorder shares that limit)"
)


def _record(
    tmp: Path, store: Path, run_id: str, limits: ContainerResources, image: str, *mode: str
) -> Outcome:
    data = tmp / "data"
    if not data.exists():
        (data / "public").mkdir(parents=True)
        for source in (AGENT, AGENT.with_name("pid_bomb.py")):
            shutil.copy(source, data / "public" / source.name)
    with FakeUpstream() as upstream:
        spec = RunSpec(
            argv=["python3", f"/data/public/{AGENT.name}", *mode],
            store=store,
            run_id=run_id,
            data_dir=data,
            time_limit_s=300,
            upstreams={"openai": upstream.url},
            env={"OPENAI_API_KEY": "sk-real-exhaust-" + "3c" * 16},
        )
        return record(spec, DockerBackend(image, resources=limits, stream_output=False))


def _verified(store: Path) -> None:
    ingest(store)
    proc = subprocess.run([*AMB, "verify", "--store", str(store)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _sealed(st: Store, run_id: str) -> dict[str, dict]:
    ((payload,),) = st.con.execute(
        "SELECT payload FROM events WHERE run_id = ? AND kind = 'submission.sealed'", [run_id]
    ).fetchall()
    return {f["path"]: f for f in json.loads(payload)["files"]}


def test_exhaustion_then_work_ends_the_same_way_each_time(tmp_path: Path, agent_image: str) -> None:
    store = tmp_path / "store"
    runs = [f"exhaust-{i}" for i in range(soak(2, 5))]
    outcomes = [_record(tmp_path, store, run, WORK_LIMITS, agent_image) for run in runs]
    assert {(o.status, o.reason, o.exit_code) for o in outcomes} == {("completed", None, 0)}, outcomes
    _verified(store)
    reports = {}
    with Store.open(store, read_only=True) as st:
        for run in runs:
            sealed = _sealed(st, run)
            # The 5,200 files do not push the agent's deliverables out of the sealed listing.
            submission = st.blobs.get(sealed["out/submission.json"]["content"]["blob"])
            assert json.loads(submission) == {"answer": TEXT}, run
            reports[run] = json.loads(st.blobs.get(sealed["out/exhaust.json"]["content"]["blob"]))
            # The model call after the bombs, through the proxy.
            calls = st.con.execute("SELECT text FROM model_calls WHERE run_id = ?", [run]).fetchall()
            assert calls == [(TEXT,)], (run, calls)
    for run, report in reports.items():
        assert report["huge_workspace"]["written_mb"] == 1200, report["huge_workspace"]
        assert report["oom_immunity"]["after"] == "0", report["oom_immunity"]  # the agent cannot opt out
        bomb = report["fork_bomb"]
        assert bomb["error"] and bomb["threads"] < WORK_LIMITS.pids, bomb  # every pid was taken
        assert (report["shell"]["exit"], report["shell"]["out"]) == (0, "5200"), report["shell"]
        # The shim kept recording: the connect made while no pid was left is there, with its
        # outcome, no syscall went unrecorded, and its final report came.
        events = shim_events(store, run)
        assert ": " not in bomb["connected"], bomb  # (an error would follow the address)
        host, port = bomb["connected"].rsplit(":", 1)
        connects = [p for p in payloads(events, "network.request") if (p.host, p.port) == (host, int(port))]
        assert [c.error for c in connects] == [None], (run, bomb, connects)
        (finished,) = [n.data for n in payloads(events, "note") if n.text == "shim finished"]
        assert finished["tracer_errors"] == 0 and finished["connects_on_reserve"] == 1, finished
        assert finished["oom_kills"] == 0, finished
    assert_audit_scan_agrees(store, runs)  # the built-in audit scanner finds what `amb audit` finds


def test_running_out_of_memory_ends_the_same_way(tmp_path: Path, agent_image: str) -> None:
    store = tmp_path / "store"
    runs = [f"oom-{i}" for i in range(2)]
    outcomes = [_record(tmp_path, store, run, MEMORY_LIMITS, agent_image, "memory") for run in runs]
    assert {(o.status, o.reason, o.exit_code) for o in outcomes} == {("failed", OUT_OF_MEMORY, 137)}, outcomes
    _verified(store)
    for run in runs:
        events = shim_events(store, run)
        assert payloads(events, "note")[0].text == "shim started", run
        finished = [n.data for n in payloads(events, "note") if n.text == "shim finished"]
        if finished:  # the OOM killer took one of the agent's: the shim stopped the agent, said why
            assert finished[0]["oom_kills"] >= 1, finished
            assert any("ran out of memory" in n.text for n in payloads(events, "note")), run
        # (Otherwise it took the shim, whose record ends there; the run says the same.)
    assert_audit_scan_agrees(store, runs)


def test_a_shim_that_dies_ends_the_run_as_a_recorder_error(tmp_path: Path, agent_image: str) -> None:
    """Whatever ends the shim before the agent (here a SIGKILL from inside the container), the run
    says that its record stops there, rather than passing the container's 137 off as the agent's."""
    backend = DockerBackend(agent_image, stream_output=False)
    spec = RunSpec(
        argv=["sh", "-c", "echo up > up; sleep 60"],
        store=tmp_path / "store",
        run_id="shim-dies",
        time_limit_s=120,
    )
    outcomes: list[Outcome] = []
    recorder = threading.Thread(target=lambda: outcomes.append(record(spec, backend)))
    recorder.start()
    deadline = time.monotonic() + 60
    while not (backend.workspace is not None and (backend.workspace / "up").exists()):
        assert time.monotonic() < deadline, "the agent did not start"
        time.sleep(0.1)
    (container,) = backend.client.containers.list(filters={"label": "org.amb.run=shim-dies"})
    # The shim is the child of the container's init (PID 1).
    killed = container.exec_run(["sh", "-c", "kill -KILL $(cat /proc/1/task/1/children)"])
    assert killed.exit_code == 0, killed.output
    recorder.join(120)
    (outcome,) = outcomes
    assert (outcome.status, outcome.exit_code) == ("recorder_error", 137)
    assert outcome.reason == (
        "the shim ended before its final report: what the agent did after its last record is missing"
    )


def test_tmpfs_mounts_beyond_the_memory_limit_are_refused() -> None:
    # An agent's files there outlive its processes: the OOM killer would find nothing to free.
    with pytest.raises(DockerBackendError, match="do not fit in the memory limit of 1g"):
        ContainerResources(memory="1g", tmp_size="512m")
    ContainerResources(memory="1g", tmp_size="256m")
    # Unless given, the mounts take a quarter of a limit below 8g each: a 1g container starts.
    assert (
        ContainerResources(memory="1g").tmp_size == "256m"
        and ContainerResources(memory="16g").tmp_size == "2048m"
    )
    assert ContainerResources(memory=None).tmp_size == "2048m"
