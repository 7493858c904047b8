"""End to end in the docker backend: a real agent (the openai SDK through the recording proxy, bash
commands, nested processes) recorded by `amb-record --backend docker`, then checked in the store
against the ground truth of what the agent did.

Needs dockerd (CI starts it with .ci/dockerd.sh); never skipped.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from replay.store import Store
from tests.fakes.upstream import TEXT, FakeUpstream

REAL_KEY = "sk-real-e2e-" + "7f3a9c" * 6

AGENT = textwrap.dedent("""
    import json, os, subprocess, time
    import openai

    client = openai.OpenAI()
    r1 = client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "plan"}])
    chunks = client.chat.completions.create(model="gpt-test", stream=True,
                                            messages=[{"role": "user", "content": "go"}])
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def sh(cmd):
        subprocess.run(["bash", "-c", cmd], check=True)
        time.sleep(0.3)   # an agent's tool calls are separated by model calls

    sh("echo one > notes.txt")
    sh("echo two >> notes.txt")
    sh("mkdir -p out && mv notes.txt out/notes.txt")
    sh("echo scratch > scratch.tmp")
    sh("rm scratch.tmp")
    # a child bash, its grandchild sh (short-lived), which writes its own pid and its parent's
    subprocess.run(["bash", "-c", 'sh -c "$0" || true; true', "echo $$ $PPID > out/grandchild.txt; exit 5"])
    sh("ls /data/public > out/inputs.txt")
    sh("echo cached > /tmp/outside.txt")   # outside the workspace: recorded too, by absolute path
    facts = {"r1": r1.choices[0].message.content, "streamed": streamed,
             "key": os.environ.get("OPENAI_API_KEY"), "uid": os.getuid(),
             "brief": open("tier_prompt.txt").read()[:40], "cwd": os.getcwd(),
             "data": os.environ.get("AMB_DATA")}
    with open("out/facts.json", "w") as f:
        json.dump(facts, f)
""")


def _data_dir(tmp: Path) -> Path:
    data = tmp / "data"
    (data / "public" / "case_00000").mkdir(parents=True)
    (data / "public" / "case_00000" / "ct.nii.gz").write_bytes(b"not really a nifti")
    (data / "private" / "case_00000").mkdir(parents=True)
    (data / "private" / "case_00000" / "organ.nii.gz").write_bytes(b"PRIVATE-REFERENCE")
    return data


def test_docker_run_recorded_against_ground_truth(tmp_path: Path, agent_image: str) -> None:
    store = tmp_path / "store"
    data = _data_dir(tmp_path)
    with FakeUpstream() as upstream:
        env = {**os.environ, "OPENAI_API_KEY": REAL_KEY, "AMB_STORE": str(store)}
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from amb.record import main; main()",
                "--backend",
                "docker",
                "--task",
                "kidney-seg",
                "--tier",
                "lite",
                "--data",
                str(data),
                "--run-id",
                "e2e-docker",
                "--upstream",
                f"openai={upstream.url}",
                "--time-limit",
                "120",
                "--",
                "python3",
                "-c",
                AGENT,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        # The provider got the real key; the agent only ever held a placeholder.
        assert [r.headers.get("authorization") for r in upstream.requests] == [f"Bearer {REAL_KEY}"] * 2

    with Store.open(store, read_only=True) as st:

        def q(sql):
            return st.con.execute(sql, ["e2e-docker"]).fetchall()

        status, backend = q("SELECT status, backend FROM runs WHERE run_id = ?")[0]
        assert (status, backend) == ("completed", "docker")

        # Every model call.
        calls = q("SELECT stream, text, ok FROM model_calls WHERE run_id = ? ORDER BY seq")
        assert calls == [(False, TEXT, True), (True, TEXT, True)]

        # Every process, including the short-lived grandchild, with its parentage and exit code.
        procs = q(
            "SELECT pid, ppid, argv, exit_code, cwd, tracer FROM processes WHERE run_id = ? AND tracer "
            "= 'seccomp-notify'"
        )
        procs = [(pid, ppid, json.loads(argv), code, cwd) for pid, ppid, argv, code, cwd, _ in procs]
        gc_pid, gc_ppid = map(int, st.blobs.get(_sealed(st, "out/grandchild.txt")).split())
        grandchild = [p for p in procs if p[0] == gc_pid]
        assert len(grandchild) == 1
        assert grandchild[0][2][:2] == ["sh", "-c"] and grandchild[0][3] == 5 and grandchild[0][1] == gc_ppid
        child = [p for p in procs if p[0] == gc_ppid]
        assert child and child[0][2][:3] == ["bash", "-c", 'sh -c "$0" || true; true']
        agent_root = [p for p in procs if p[2][:2] == ["python3", "-c"]]
        assert len(agent_root) == 1 and agent_root[0][3] == 0 and agent_root[0][4] == "/workspace"
        argvs = [p[2] for p in procs]
        for expected in (
            ["mv", "notes.txt", "out/notes.txt"],
            ["rm", "scratch.tmp"],
            ["mkdir", "-p", "out"],
            ["ls", "/data/public"],
        ):
            assert expected in argvs, f"{expected} not recorded"

        # Every file change, with content.
        writes = q("SELECT path, op, content_blob FROM file_writes WHERE run_id = ? ORDER BY seq")
        contents = [(p, op, st.blobs.get(b)) for p, op, b in writes]
        assert ("notes.txt", "created", b"one\n") in contents
        assert ("notes.txt", "modified", b"one\ntwo\n") in contents
        assert ("scratch.tmp", "created", b"scratch\n") in contents
        assert ("out/grandchild.txt", "created", f"{gc_pid} {gc_ppid}\n".encode()) in contents
        assert ("/tmp/outside.txt", "created", b"cached\n") in contents
        assert not [p for p, _, _ in contents if "amb-shim-" in p]  # the shim's own files are not the agent's
        renames = q(
            "SELECT payload->>'src', payload->>'dst' FROM events WHERE run_id = ? AND kind = 'file.renamed'"
        )
        assert renames == [("notes.txt", "out/notes.txt")]
        # (Python's tempfile probes /tmp with a file it deletes at once: outside the workspace, also a fact.)
        deletes = q(
            "SELECT payload->>'path' FROM events WHERE run_id = ? AND kind = 'file.deleted' "
            "AND NOT starts_with(payload->>'path', '/')"
        )
        assert deletes == [("scratch.tmp",)]

        # The sealed submission is the workspace as the agent left it.
        facts = json.loads(st.blobs.get(_sealed(st, "out/facts.json")))
        assert facts["r1"] == TEXT and facts["streamed"] == TEXT
        assert facts["key"] != REAL_KEY and REAL_KEY not in json.dumps(facts)
        assert facts["uid"] != 0 and facts["cwd"] == "/workspace"
        assert facts["data"] == "/data/public"  # the name amb-record gives on every backend
        assert (
            facts["brief"]
            == (Path(__file__).resolve().parents[2] / "tasks/kidney-seg/lite.md").read_text()[:40]
        )
        assert st.blobs.get(_sealed(st, "out/notes.txt")) == b"one\ntwo\n"
        assert st.blobs.get(_sealed(st, "out/inputs.txt")) == b"case_00000\n"
        sealed_paths = {f["path"] for f in _seal(st)["files"]}
        assert "scratch.tmp" not in sealed_paths and "notes.txt" not in sealed_paths

        # The shim's stream was complete and used the real tracer.
        notes = q(
            "SELECT payload->>'text', payload->'data'->>'tracer' FROM events WHERE run_id = ? AND kind "
            "= 'note' "
            "AND source = 'shim' ORDER BY seq"
        )
        assert notes[0] == ("shim started", "seccomp-notify") and notes[-1][0] == "shim finished"


def _seal(st: Store) -> dict:
    ((payload,),) = st.con.execute(
        "SELECT payload FROM events WHERE run_id = 'e2e-docker' AND kind = 'submission.sealed'"
    ).fetchall()
    return json.loads(payload)


def _sealed(st: Store, path: str) -> str:
    for f in _seal(st)["files"]:
        if f["path"] == path:
            return f["content"]["blob"]
    raise AssertionError(f"{path} not in the sealed submission")


def test_time_limit_stops_the_container_and_keeps_the_record(tmp_path: Path, agent_image: str) -> None:
    from recorder.docker_backend import DockerBackend
    from recorder.run import RunSpec, record
    from tests.recorder.shim_helpers import payloads, shim_events

    store = tmp_path / "store"
    run_id = f"limit-{secrets.token_hex(3)}"  # the docker engine is shared: labels must be unique
    backend = DockerBackend(agent_image, stream_output=False)
    outcome = record(
        RunSpec(
            argv=["bash", "-c", "echo started > s.txt; sleep 300"],
            store=store,
            run_id=run_id,
            time_limit_s=3,
            grace_s=5,
        ),
        backend,
    )
    assert outcome.status == "timeout" and outcome.exit_code == 124
    events = shim_events(store, run_id)
    assert [w.path for w in payloads(events, "file.written")] == ["s.txt"]
    sleeps = [p for p in payloads(events, "process.exited") if p.argv == ["sleep", "300"]]
    assert len(sleeps) == 1 and sleeps[0].signal == 15  # the SIGTERM reached the agent's own process
    # Everything of the run is gone from docker.
    client = backend.client
    assert not client.containers.list(
        all=True, filters={"label": f"org.amb.run={run_id}"}, ignore_removed=True
    )
    assert not [n for n in client.networks.list() if n.name == backend.network_name]


def test_a_stop_signal_while_dockerd_creates_the_container_leaves_no_container(
    tmp_path: Path, agent_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop signal (``amb sweep cancel``) can land while ``docker create`` is in flight: dockerd
    makes the container, its answer never reaches the recorder. Closing the run still removes it."""
    import docker.models.containers

    from recorder.docker_backend import DockerBackend
    from recorder.run import RunSpec, Stopped, record

    real_create = docker.models.containers.ContainerCollection.create

    def created_then_stopped(
        self: docker.models.containers.ContainerCollection, *args: Any, **kwargs: Any
    ) -> Any:
        real_create(self, *args, **kwargs)
        raise Stopped("SIGTERM")

    monkeypatch.setattr(docker.models.containers.ContainerCollection, "create", created_then_stopped)
    run_id = f"stopped-{secrets.token_hex(3)}"  # the docker engine is shared: labels must be unique
    backend = DockerBackend(agent_image, stream_output=False)
    with pytest.raises(Stopped):
        record(RunSpec(argv=["true"], store=tmp_path / "store", run_id=run_id), backend)
    client = backend.client
    assert not client.containers.list(
        all=True, filters={"label": f"org.amb.run={run_id}"}, ignore_removed=True
    )
    assert not [n for n in client.networks.list() if n.name == backend.network_name]
