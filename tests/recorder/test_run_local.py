"""``recorder.run.record`` with the local backend: exit codes, time limit, signals, environment,
the sealed submission. Real child processes; the fake upstream stands in for the providers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from recorder.run import RunSpec, record
from recorder.spool import spool_path
from schemas.blobstore import BlobStore
from schemas.codec import decode_event
from schemas.errors import UsageError
from schemas.events import SubmissionSealed
from schemas.frames import scan
from tests.fakes.harness import REAL_KEYS
from tests.fakes.upstream import FakeUpstream


@pytest.fixture(scope="module")
def fake():
    with FakeUpstream() as f:
        yield f


def run(tmp_path: Path, fake, argv: list[str], **kw):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    spec = RunSpec(
        argv=argv,
        store=tmp_path / "store",
        workspace=ws,
        env=dict(REAL_KEYS),
        upstreams=kw.pop("upstreams", {"openai": fake.url, "anthropic": fake.url}),
        **kw,
    )
    outcome = record(spec)
    events = [
        decode_event(b) for b in scan(spool_path(spec.store, outcome.run_id, "recorder").read_bytes()).bodies
    ]
    return outcome, {e.kind: e.payload for e in events}, [e.kind for e in events]


def test_exit_code_is_propagated(tmp_path, fake):
    out, ev, kinds = run(
        tmp_path, fake, ["sh", "-c", "exit 3"], labels={"sweep": "a"}, task="kidney-seg", tier="lite"
    )
    assert (out.status, out.exit_code) == ("failed", 3)
    assert kinds == ["run.started", "process.exited", "submission.sealed", "run.finished"]
    assert ev["run.finished"].status == "failed" and ev["run.finished"].exit_code == 3
    assert ev["process.exited"].exit_code == 3 and ev["process.exited"].tracer == "recorder"
    started = ev["run.started"]
    assert (started.task, started.tier, started.labels, started.command) == (
        "kidney-seg",
        "lite",
        {"sweep": "a"},
        ["sh", "-c", "exit 3"],
    )
    assert started.tool_versions["mitmproxy"] == "11.0.2"


def test_success(tmp_path, fake):
    out, ev, _ = run(tmp_path, fake, ["true"])
    assert (out.status, out.exit_code, ev["run.finished"].status) == ("completed", 0, "completed")


def test_time_limit_sends_sigterm(tmp_path, fake):
    out, ev, _ = run(tmp_path, fake, ["sleep", "30"], time_limit_s=0.5)
    assert (out.status, out.exit_code) == ("timeout", 124)
    assert ev["run.finished"].exit_code == 124 and "SIGTERM" in ev["run.finished"].reason
    assert out.duration_s < 10
    assert ev["process.exited"].signal == 15


def test_time_limit_escalates_to_sigkill(tmp_path, fake):
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
        "time.sleep(60)"
    )
    out, ev, _ = run(tmp_path, fake, [sys.executable, "-c", stubborn], time_limit_s=1.0, grace_s=0.5)
    assert (out.status, out.exit_code) == ("timeout", 124)
    assert "SIGKILL" in ev["run.finished"].reason and ev["process.exited"].signal == 9


def test_agent_killed_by_a_signal(tmp_path, fake):
    out, ev, _ = run(tmp_path, fake, ["sh", "-c", "kill -9 $$"])
    assert (out.status, out.exit_code) == ("killed", 137)
    assert "SIGKILL" in ev["run.finished"].reason


def test_command_not_found_is_a_failed_run(tmp_path, fake):
    out, ev, _ = run(tmp_path, fake, ["no-such-agent-binary-xyz"])
    assert (out.status, out.exit_code) == ("failed", 127)
    assert "command not found" in ev["run.finished"].reason


def test_agent_environment_has_placeholders_not_keys(tmp_path, fake):
    dump = (
        "import json, os, pathlib; pathlib.Path('env.json').write_text(json.dumps(dict(os.environ))); "
        "pathlib.Path('ca.pem').write_text(open(os.environ['SSL_CERT_FILE']).read())"
    )
    out, _, _ = run(tmp_path, fake, [sys.executable, "-c", dump])
    env = json.loads((tmp_path / "ws" / "env.json").read_text())
    assert env["OPENAI_API_KEY"].startswith("amb-placeholder-openai-")
    assert env["ANTHROPIC_API_KEY"].startswith("amb-placeholder-anthropic-")
    assert not any(k in v for v in env.values() for k in REAL_KEYS.values())
    assert env["OPENAI_BASE_URL"].startswith("http://127.0.0.1:") and env["OPENAI_BASE_URL"].endswith("/v1")
    assert env["HTTPS_PROXY"].startswith("http://127.0.0.1:") and "127.0.0.1" in env["NO_PROXY"]
    for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        assert env[var] == env["SSL_CERT_FILE"]
    bundle = (tmp_path / "ws" / "ca.pem").read_text()
    assert bundle.count("BEGIN CERTIFICATE") > 1  # system CAs + the per-run CA
    assert env["AMB_RUN_ID"] == out.run_id
    assert not Path(env["SSL_CERT_FILE"]).exists()  # the per-run CA is gone with the run


def test_every_upstream_gets_its_variables_and_no_real_key_reaches_the_agent(tmp_path, fake, monkeypatch):
    # Keys of every kind in amb-record's own environment, one the agent would find first.
    monkeypatch.setenv("GOOGLE_API_KEY", "AIza-REAL-google-in-the-environment")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-REAL-in-the-environment")
    monkeypatch.setenv("HELPER_API_KEY", "sk-REAL-helper-in-the-environment")
    dump = "import json, os, pathlib; pathlib.Path('env.json').write_text(json.dumps(dict(os.environ)))"
    ups = {"openai": fake.url, "helper": f"openai:{fake.url}/api/v1", "gemini": fake.url + "/google"}
    out, _, _ = run(tmp_path, fake, [sys.executable, "-c", dump], upstreams=ups)
    env = json.loads((tmp_path / "ws" / "env.json").read_text())
    assert env["HELPER_API_KEY"].startswith("amb-placeholder-helper-")
    assert env["GEMINI_API_KEY"].startswith("amb-placeholder-gemini-") and env["GOOGLE_API_KEY"] == ""
    assert "AZURE_OPENAI_API_KEY" not in env  # no azure upstream: the variable is simply removed
    assert env["HELPER_BASE_URL"].endswith("/v1") and env["GOOGLE_GEMINI_BASE_URL"].startswith(
        "http://127.0.0.1:"
    )
    assert env["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:")  # the default kinds are always there
    ports = {
        env[v].split(":")[2].split("/")[0]
        for v in ("OPENAI_BASE_URL", "HELPER_BASE_URL", "GOOGLE_GEMINI_BASE_URL")
    }
    assert len(ports) == 3  # one reverse endpoint per upstream, even on one host
    assert not any("REAL" in v for v in env.values())


def test_submission_is_sealed(tmp_path, fake):
    script = "mkdir -p out && printf 'mask' > out/a.txt && printf '{}' > plan.json && ln -s /etc/passwd link"
    out, ev, _ = run(tmp_path, fake, ["sh", "-c", script])
    sealed = ev["submission.sealed"]
    files = {f.path: f for f in sealed.files}
    assert set(files) == {"out/a.txt", "plan.json"}
    assert BlobStore(tmp_path / "store" / "blobs").get(files["out/a.txt"].content) == b"mask"
    assert sealed.skipped == ["link: symlink"]


def test_store_and_private_files_inside_the_workspace_are_not_sealed(tmp_path, fake):
    # The default store is ./amb-store, i.e. inside the workspace (the current directory).
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = RunSpec(
        argv=["sh", "-c", "echo hi > result.txt"],
        store=ws / "amb-store",
        workspace=ws,
        env=dict(REAL_KEYS),
        upstreams={"openai": fake.url, "anthropic": fake.url},
    )
    out = record(spec)
    events = [
        decode_event(b) for b in scan(spool_path(spec.store, out.run_id, "recorder").read_bytes()).bodies
    ]
    (sealed,) = [e.payload for e in events if isinstance(e.payload, SubmissionSealed)]
    assert [f.path for f in sealed.files] == ["result.txt"]
    assert sealed.skipped == ["amb-store/: amb-record's own files"]


def test_temp_dirs_of_killed_recorders_are_swept(tmp_path, fake):
    import subprocess
    import tempfile

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Path(tempfile.mkdtemp(prefix="amb-stale-run-"))
    (stale / "pid").write_text(str(dead.pid))
    (stale / "ca").mkdir()
    run(tmp_path, fake, ["true"])
    assert not stale.exists()


def test_run_id_cannot_be_reused(tmp_path, fake):
    run(tmp_path, fake, ["true"], run_id="fixed-id")
    with pytest.raises(UsageError, match="already exists"):
        run(tmp_path, fake, ["true"], run_id="fixed-id")
    with pytest.raises(UsageError, match="invalid run id"):
        run(tmp_path, fake, ["true"], run_id="bad id!")
