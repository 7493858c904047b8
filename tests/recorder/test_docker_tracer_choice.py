"""Which process tracer the shim takes inside a container, and that it says why.

With the docker backend's capabilities the shim traces with seccomp notification (the other
container tests check its records). Without CAP_SYS_PTRACE it cannot read the agent's memory:
``auto`` must then fall back to strace and say why in the record, and asking for seccomp-notify
outright must fail with that reason rather than record a run without processes. Real dockerd,
real image; never skipped.
"""

from __future__ import annotations

from pathlib import Path

import docker

from recorder.docker_backend import CAPS, SHIM_ENTRY
from recorder.shim.receiver import ShimReceiver
from tests.recorder.shim_helpers import payloads, shim_events


def _shim_in_container(
    tmp_path: Path, image: str, run_id: str, tracer: str, caps: list[str]
) -> tuple[int, str]:
    store, sock = tmp_path / "store", tmp_path / f"sock-{run_id}"
    sock.mkdir(mode=0o700)
    receiver = ShimReceiver(store, run_id, sock).start()
    client = docker.from_env()
    container = client.containers.run(
        image,
        [
            "/opt/venv/bin/python",
            "-I",
            "-c",
            SHIM_ENTRY,
            "run",
            "--socket",
            "/run/amb/sock/shim.sock",
            "--workspace",
            "/workspace",
            "--agent-uid",
            "1000",
            "--tracer",
            tracer,
            "--",
            "sh",
            "-c",
            "/bin/true; exit 3",
        ],
        detach=True,
        init=True,
        network_mode="none",
        security_opt=["no-new-privileges"],
        cap_drop=["ALL"],
        cap_add=caps,
        read_only=True,
        volumes={str(sock): {"bind": "/run/amb/sock", "mode": "ro"}},
        tmpfs={"/tmp": "size=64m,mode=1777", "/workspace": "size=64m,mode=1777"},
        user="0:0",
    )
    try:
        status = container.wait(timeout=120)["StatusCode"]
        logs = container.logs().decode()
    finally:
        container.remove(force=True)
        receiver.close()
    return status, logs


def test_without_ptrace_capability_auto_falls_back_to_strace(tmp_path: Path, agent_image: str) -> None:
    caps = [c for c in CAPS if c != "SYS_PTRACE"]
    status, logs = _shim_in_container(tmp_path, agent_image, "fallback", "auto", caps)
    assert status == 3, logs
    events = shim_events(tmp_path / "store", "fallback")
    hello = payloads(events, "note")[0]
    assert hello.data["tracer"] == "strace" and hello.data["fallback"] is False
    assert "seccomp" in hello.data["detail"]  # why the better tracer was not taken
    procs = sorted((p.argv, p.exit_code, p.tracer) for p in payloads(events, "process.exited"))
    assert procs == [(["/bin/true"], 0, "strace"), (["sh", "-c", "/bin/true; exit 3"], 3, "strace")]


def test_asking_for_seccomp_notify_where_it_cannot_work_fails_clearly(
    tmp_path: Path, agent_image: str
) -> None:
    caps = [c for c in CAPS if c != "SYS_PTRACE"]
    status, logs = _shim_in_container(tmp_path, agent_image, "forced", "seccomp-notify", caps)
    assert status == 125
    assert "amb-shim:" in logs and "Traceback" not in logs
    events = shim_events(tmp_path / "store", "forced")
    assert not payloads(events, "process.exited")
    assert any(n.text.startswith("shim: ") for n in payloads(events, "note"))
