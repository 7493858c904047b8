"""``recorder.run.record`` with the local backend, where it differs from the others: the agent's
environment, amb-record's own files inside the workspace, stale temp dirs, run ids. What every
backend does (exit codes, time limit, signals, sealing, cleanup) is ``test_backend_contract.py``.
Real child processes; the fake upstream stands in for the providers."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from recorder.local_backend import LocalBackend
from recorder.run import RunSpec, Stopped, record
from recorder.spool import spool_path
from schemas.codec import decode_event
from schemas.errors import RunExists, UsageError
from schemas.events import RunFinished
from schemas.frames import scan
from tests.fakes.harness import REAL_KEYS


def run(tmp_path: Path, fake, argv: list[str], store: Path | None = None, **kw):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    spec = RunSpec(
        argv=argv,
        store=store or tmp_path / "store",
        workspace=ws,
        env=dict(REAL_KEYS),
        upstreams={"openai": fake.url, "anthropic": fake.url},
        **kw,
    )
    outcome = record(spec)
    events = [
        decode_event(b) for b in scan(spool_path(spec.store, outcome.run_id, "recorder").read_bytes()).bodies
    ]
    return outcome, {e.kind: e.payload for e in events}, [e.kind for e in events]


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


def test_store_and_private_files_inside_the_workspace_are_not_sealed(tmp_path, fake):
    # The default store is ./amb-store, i.e. inside the workspace (the current directory).
    _, ev, _ = run(tmp_path, fake, ["sh", "-c", "echo hi > result.txt"], store=tmp_path / "ws" / "amb-store")
    sealed = ev["submission.sealed"]
    assert [f.path for f in sealed.files] == ["result.txt"]
    assert sealed.skipped == ["amb-store/: amb-record's own files"]


def test_temp_dirs_of_killed_amb_processes_are_swept(tmp_path, fake, monkeypatch):
    # A process that made a temp dir the way amb does (named in its lock) and was killed before it
    # could remove it: the next recording removes it, in this test's own temp dir.
    import subprocess
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = subprocess.run(
        [sys.executable, "-c", MAKE_AND_DIE, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert made.returncode == -signal.SIGKILL, made.stderr
    stale = Path(made.stdout.strip())
    assert stale.is_dir() and stale.parent == tmp_path
    run(tmp_path, fake, ["true"])
    assert not stale.exists()
    assert not (tmp_path / "amb-runs").exists()  # its lock went with it, and the directory with the last


MAKE_AND_DIE = """
import os, signal, sys
from pathlib import Path
from schemas.tempdirs import make_tempdir
path = make_tempdir("amb-stale-run-", Path(sys.argv[1]))
(path / "ca").mkdir()
print(path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_run_id_cannot_be_reused(tmp_path, fake):
    run(tmp_path, fake, ["true"], run_id="fixed-id")
    with pytest.raises(RunExists, match="already exists"):
        run(tmp_path, fake, ["true"], run_id="fixed-id")
    with pytest.raises(UsageError, match="invalid run id"):
        run(tmp_path, fake, ["true"], run_id="bad id!")


def test_a_run_id_an_import_holds_is_not_recorded_into(tmp_path, fake):
    """Any source's spool claims the id: a run recorded under an imported run's id would merge
    with it (its events appended to the imported run, its manifest broken)."""
    from recorder.importers.common import RunBuilder, write
    from schemas.events import RunStarted

    b = RunBuilder("taken-by-import")
    b.emit(RunStarted(backend="import"), 1_000)
    b.emit(RunFinished(status="completed"), 2_000)
    write(tmp_path / "store", b)
    before = sorted(p.name for p in (tmp_path / "store" / "spool" / "taken-by-import").iterdir())
    with pytest.raises(RunExists, match="'taken-by-import' already exists .*import spools"):
        run(tmp_path, fake, ["true"], run_id="taken-by-import")
    assert sorted(p.name for p in (tmp_path / "store" / "spool" / "taken-by-import").iterdir()) == before


class _SignalledWhileClosing(LocalBackend):
    """The local backend, and a stop signal to this process in the middle of closing the run (as
    a Ray worker's death sends one moments after the cancel that stopped the agent)."""

    def seal_submission(self, handle):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next bytecode, here
        return super().seal_submission(handle)


def _stopped_run(tmp_path, fake, run_id: str, backend=None, on_ready=None):
    """``record`` under the handler ``amb sweep exec`` installs (a stop signal raises ``Stopped``),
    which must raise ``Stopped``; returns the recorder's events and the workspace."""

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(signal.Signals(signum).name)

    ws = tmp_path / "ws"
    ws.mkdir()
    spec = RunSpec(
        argv=[sys.executable, "-c", "open('ran', 'w').close()"],
        store=tmp_path / "store",
        workspace=ws,
        run_id=run_id,
        upstreams={"openai": fake.url},
    )
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(Stopped, match="SIGTERM"):
            record(spec, backend, on_ready=on_ready)
        assert signal.getsignal(signal.SIGTERM) is stop  # the handler of before is back
    finally:
        signal.signal(signal.SIGTERM, previous)
    path = spool_path(spec.store, run_id, "recorder")
    return [decode_event(b) for b in scan(path.read_bytes()).bodies], ws


def test_a_stop_signal_while_the_run_closes_waits_for_run_finished(tmp_path, fake):
    """A stop signal that lands while the run is being closed is delivered once it is closed: the
    run keeps its ``run.finished`` (with the agent's own outcome), then ``Stopped`` is raised."""
    events, ws = _stopped_run(tmp_path, fake, "stopped-while-closing", _SignalledWhileClosing())
    finished = events[-1].payload
    assert isinstance(finished, RunFinished) and (finished.status, finished.exit_code) == ("completed", 0)
    assert [e.kind for e in events][-2:] == ["submission.sealed", "run.finished"]
    assert (ws / "ran").exists()


def test_a_stop_signal_while_no_agent_runs_closes_the_run_as_killed(tmp_path, fake):
    """``amb sweep exec`` turns a stop signal into ``Stopped`` while no agent is running to forward it
    to; one that lands after the run started but before the agent did closes the run as ``killed``
    (an interrupted attempt, retried without counting as a failure), not as a recorder error."""
    events, ws = _stopped_run(
        tmp_path, fake, "stopped-early", on_ready=lambda *_: os.kill(os.getpid(), signal.SIGTERM)
    )
    finished = events[-1].payload
    assert isinstance(finished, RunFinished)
    assert (finished.status, finished.exit_code) == ("killed", 128 + signal.SIGTERM)
    assert "SIGTERM" in (finished.reason or "")
    assert not (ws / "ran").exists()  # the agent never started
