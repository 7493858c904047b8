"""The backend contract (``recorder.backend``), written once and run against every backend.

``BackendContract`` holds what ``amb-record`` promises whatever runs the agent: exit codes in the
shell's convention, the time limit (SIGTERM, then SIGKILL after the grace period), signals
forwarded to the agent, the sealed submission (what the agent left, symlinks skipped), and that
closing the run leaves nothing of it behind. Each subclass says how to build its backend and how
to look for leftovers; the local one runs child processes here, the docker one real containers
(dockerd is running on CI; never skipped).
"""

from __future__ import annotations

import gc
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from click.testing import CliRunner

from amb.main import cli
from recorder.backend import SEAL_MAX_FILES, Backend
from recorder.docker_backend import DockerBackend
from recorder.local_backend import LocalBackend
from recorder.run import Outcome, RunSpec, record
from recorder.spool import spool_path
from replay.web.server import Running
from schemas.blobstore import BlobStore
from schemas.codec import decode_event
from schemas.frames import scan
from schemas.ostext import os_bytes, os_text
from tests.descriptors import open_targets
from tests.fakes.harness import REAL_KEYS
from tests.recorder.processes import running_with
from tests.recorder.shim_helpers import shim_events

READY = "up.txt"
"""Agents here write this file once they run: the tests wait for it instead of sleeping."""


class BackendContract:
    """The behaviours every backend must show. Subclasses implement ``make`` and ``leftovers``."""

    def make(self) -> Backend:
        raise NotImplementedError

    def leftovers(self, backend: Any, run_id: str) -> list[str]:
        """What of the run still exists after it finished (processes, containers, networks)."""
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _paths(self, tmp_path: Path) -> None:
        self.current: str | None = None
        """The run id of the run in progress (set before it starts)."""
        self.store = tmp_path / "store"
        self.ws = tmp_path / "ws"
        self.ws.mkdir()

    def run(
        self, agent: str | list[str], name: str, ready_first: bool = False, **kw: Any
    ) -> tuple[Outcome, dict[str, Any], list[str], Any]:
        """Record ``agent`` (a shell script, or an argv); returns the outcome, the recorder's events
        by kind, their kinds in order, and the backend. ``ready_first``: the agent's time limit
        counts from the moment it wrote ``READY`` (``_start_when_ready``)."""
        run_id = self.current = f"contract-{name}-{secrets.token_hex(3)}"  # unique on a shared dockerd
        backend = self.make()
        if ready_first:
            self._start_when_ready(backend)
        spec = RunSpec(
            argv=["sh", "-c", agent] if isinstance(agent, str) else agent,
            store=self.store,
            run_id=run_id,
            workspace=self.ws,
            env=dict(REAL_KEYS),
            **kw,
        )
        outcome = record(spec, backend)
        path = spool_path(self.store, run_id, "recorder")
        events = [decode_event(b) for b in scan(path.read_bytes()).bodies]
        assert self.leftovers(backend, run_id) == [], "the run left something behind"
        return outcome, {e.kind: e.payload for e in events}, [e.kind for e in events], backend

    def sealed(self, payloads: dict[str, Any]) -> dict[str, bytes | None]:
        blobs = BlobStore(self.store / "blobs")
        files = payloads["submission.sealed"].files
        return {f.path: (blobs.get(f.content) if f.content else None) for f in files}

    # ---- exit codes ------------------------------------------------------------------------------

    def test_exit_code_is_propagated(self) -> None:
        out, ev, kinds, backend = self.run(
            "exit 3", "exit3", task="kidney-seg", tier="lite", labels={"sweep": "a"}
        )
        assert (out.status, out.exit_code) == ("failed", 3)
        assert kinds == ["run.started", "process.exited", "submission.sealed", "run.finished"]
        assert (ev["run.finished"].status, ev["run.finished"].exit_code) == ("failed", 3)
        assert (ev["process.exited"].exit_code, ev["process.exited"].tracer) == (3, "recorder")
        started = ev["run.started"]
        assert (started.backend, started.command) == (backend.name, ["sh", "-c", "exit 3"])
        assert (started.task, started.tier, started.labels) == ("kidney-seg", "lite", {"sweep": "a"})
        assert started.tool_versions["mitmproxy"] == "11.0.2"
        assert started.isolation.kind == {"local": "namespaces", "docker": "container"}[backend.name]

    def test_a_finished_run_holds_nothing_of_its_backend(self) -> None:
        out, _, _, backend = self.run("true", "held")
        assert out.status == "completed"
        gone = weakref.ref(backend)
        del backend
        gc.collect()
        assert gone() is None, "the process still holds the backend (its client, its run's store)"
        assert [t for t in open_targets() if t.startswith(str(self.store) + os.sep)] == []

    def test_success(self) -> None:
        out, ev, _, _ = self.run("true", "ok")
        assert (out.status, out.exit_code, ev["run.finished"].status) == ("completed", 0, "completed")
        assert ev["process.exited"].exit_code == 0 and ev["process.exited"].signal is None

    def test_command_not_found_exits_127(self) -> None:
        out, ev, _, _ = self.run(["no-such-agent-binary-xyz"], "missing")
        assert (out.status, out.exit_code) == ("failed", 127)
        assert ev["run.finished"].exit_code == 127

    def test_agent_killed_by_a_signal_exits_128_plus_n(self) -> None:
        out, ev, _, _ = self.run("kill -KILL $$", "killed")
        assert out.exit_code == 128 + signal.SIGKILL and ev["run.finished"].exit_code == 137

    # ---- time limit and signals --------------------------------------------------------------------

    def test_time_limit_sends_sigterm_to_the_agent(self) -> None:
        # The agent's own handler runs: it saw the SIGTERM, and its goodbye is in the submission.
        script = f"trap 'echo term > got-term; exit 0' TERM; echo up > {READY}; sleep 60 & wait"
        out, ev, _, _ = self.run(script, "limit", ready_first=True, time_limit_s=0.5, grace_s=20)
        assert (out.status, out.exit_code) == ("timeout", 124)
        assert ev["run.finished"].exit_code == 124 and "SIGTERM" in ev["run.finished"].reason
        assert self.sealed(ev)["got-term"] == b"term\n"

    def test_time_limit_escalates_to_sigkill(self) -> None:
        script = f"trap '' TERM; echo up > {READY}; while :; do sleep 0.1; done"
        # The agent ignores SIGTERM from the moment the time limit starts counting (ready_first):
        # however slowly it started, the limit's SIGTERM finds it deaf, and only the SIGKILL ends it.
        out, ev, _, _ = self.run(script, "stubborn", ready_first=True, time_limit_s=0.5, grace_s=0.5)
        assert (out.status, out.exit_code) == ("timeout", 124)
        assert "SIGKILL" in ev["run.finished"].reason
        assert ev["process.exited"].signal == signal.SIGKILL

    def test_signals_to_amb_record_are_forwarded(self) -> None:
        # SIGTERM to the recorder (this process) reaches the agent, whose exit code comes back.
        script = f"trap 'exit 42' TERM; echo up > {READY}; sleep 60 & wait"
        ours = signal.getsignal(signal.SIGTERM)
        sent = threading.Event()

        def send_when_forwarding() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                # Only once the agent runs and the recorder's forwarding handler is installed.
                if self._ready() and signal.getsignal(signal.SIGTERM) is not ours:
                    os.kill(os.getpid(), signal.SIGTERM)
                    sent.set()
                    return
                time.sleep(0.02)

        t = threading.Thread(target=send_when_forwarding, daemon=True)
        t.start()
        out, ev, _, _ = self.run(script, "forward", time_limit_s=120)
        t.join(5)
        assert sent.is_set()
        assert (out.status, out.exit_code) == ("killed", 42)
        assert "SIGTERM" in ev["run.finished"].reason
        assert signal.getsignal(signal.SIGTERM) is ours  # the recorder put the handler back

    def _ready(self) -> bool:
        """Whether the agent wrote ``READY`` (so it runs, with its own signal handlers set)."""
        return (self.ws / READY).exists()

    def _start_when_ready(self, backend: Backend) -> None:
        """``backend.start`` returns once the agent wrote ``READY``, so the recorder's time limit,
        which counts from there, reaches an agent whose signal handlers are set, however long the
        agent (or the shim, or a container) took to start on a loaded machine. An agent that never
        gets there still ends the wait, and the test's assertions then say what it did."""
        start = backend.start

        def start_when_ready(argv: list[str], env: dict[str, str]) -> Any:
            handle = start(argv, env)
            deadline = time.monotonic() + 120
            while not self._ready() and time.monotonic() < deadline:
                time.sleep(0.02)
            return handle

        backend.start = start_when_ready  # type: ignore[method-assign]

    # ---- the submission --------------------------------------------------------------------------

    def test_submission_is_what_the_agent_left(self) -> None:
        script = (
            "mkdir -p out/deep && printf mask > out/deep/a.txt && printf '{}' > plan.json && "
            "ln -s /etc/passwd link && echo tmp > gone.tmp && rm gone.tmp"
        )
        out, ev, _, _ = self.run(script, "seal")
        assert out.status == "completed"
        assert self.sealed(ev) == {"out/deep/a.txt": b"mask", "plan.json": b"{}"}
        assert ev["submission.sealed"].skipped == ["link: symlink"]

    # ---- names that are not UTF-8 -------------------------------------------------------------------

    shim = True
    """Whether the backend runs the agent under the shim (whose facts then include every file change
    and process)."""

    def test_names_that_are_not_utf8_are_facts(self) -> None:
        # The command itself holds bytes that are not UTF-8 (a private path the audit shows), and so
        # do the names the agent makes and the argv of a program it runs.
        argv = ["sh", "-c", NAMES_AGENT, "agent", os.fsdecode(b"/data/private/x\xff")]
        out, ev, _, _ = self.run(argv, "bytes")  # (main: amb-record died sealing it)
        assert (out.status, ev["run.finished"].status) == ("completed", "completed"), ev["run.finished"]
        started, sealed = ev["run.started"], ev["submission.sealed"]
        assert [os_bytes(a) for a in started.command] == [os.fsencode(a) for a in argv]
        assert {os_bytes(path): data for path, data in self.sealed(ev).items()} == {
            b"d\xfe/y\xfd": b"one",
            b"a\\b \\xff": b"two",
        }
        assert sealed.root == os_text(os_bytes(sealed.root))  # recorded text, as every name in it

        # Ingested, verified, audited, shown by the viewer's API and exported, names escaped as documented.
        code, text = _amb("ingest", "--store", str(self.store))
        assert code == 0, text
        run = self.current
        assert run is not None
        code, text = _amb("verify", run, "--store", str(self.store))
        assert code == 0 and "OK" in text, text
        if self.shim:
            shim = _facts(self.store, run)
            assert shim["written"] == {"d\\xfe/x\\xff", "a\\\\b \\\\xff", "z\\xfc"}
            assert shim["renamed"] == {("d\\xfe/x\\xff", "d\\xfe/y\\xfd")}
            assert shim["deleted"] == {"z\\xfc"}
            assert ["cat", "/data/private/x\\xff"] in shim["argv"]
            # The agent ran with the very bytes it was given (Docker's API carries UTF-8 text only).
            assert [os.fsencode(a) for a in argv] in [
                [os_bytes(a) for a in run_argv] for run_argv in shim["argv"]
            ]
            assert not shim["lost"], shim["lost"]
        code, text = _amb("audit", run, "--json", "--store", str(self.store))
        assert code == 0, text
        details = [v["detail"] for v in json.loads(text)["violations"] if v["rule"] == "private_access"]
        assert any("process sh names /data/private/x\\xff" in d for d in details), details
        if self.shim:
            assert any("process cat names /data/private/x\\xff" in d for d in details), details
        escaped = ["a\\\\b \\\\xff", "d\\xfe/y\\xfd"]
        with Running(self.store) as viewer:
            events = _get(viewer.url, f"/api/runs/{run}/events?limit=500")["events"]
            (key,) = [e["key"] for e in events if e["kind"] == "submission.sealed"]
            detail = _get(viewer.url, f"/api/runs/{run}/events/{key.replace(':', '/')}")
            assert sorted(f["path"] for f in detail["payload"]["files"]) == escaped
            if self.shim:  # the workspace the file events rebuild
                workspace = _get(viewer.url, f"/api/runs/{run}/workspace")
                assert sorted(f["path"] for f in workspace["files"]) == escaped
                assert "d\\xfe/x\\xff → d\\xfe/y\\xfd" in [e["summary"] for e in events]
        for export in (["atif", "--out", str(self.ws.parent / "atif")], ["otel", "--out", "-"]):
            code, text = _amb("export", *export, run, "--store", str(self.store))
            assert code == 0, text
        code, text = _amb("export", "parquet", str(self.ws.parent / "pq"), "--store", str(self.store))
        assert code == 0, text
        if self.shim:  # a checkout makes each file under the exact bytes of its name
            code, text = _amb("checkout", run, str(self.ws.parent / "co"), "--store", str(self.store))
            assert code == 0, text
            co = os.fsencode(self.ws.parent / "co")
            assert sorted(os.listdir(co)) == [b"a\\b \\xff", b"d\xfe"]
            assert os.listdir(co + b"/d\xfe") == [b"y\xfd"]

    def test_a_crowded_directory_does_not_push_the_submission_out(self) -> None:
        # More files than a seal lists: those left out come from the directory that has thousands.
        script = "mkdir -p many out && (cd many && seq -w 5001 | xargs touch) && printf done > out/result.txt"
        out, ev, _, _ = self.run(script, "crowded")
        assert out.status == "completed"
        sealed = self.sealed(ev)
        assert len(sealed) == SEAL_MAX_FILES and sealed["out/result.txt"] == b"done"
        assert ev["submission.sealed"].skipped == [
            f"many/{n}: over the {SEAL_MAX_FILES}-file limit" for n in ("5000", "5001")
        ]


NAMES_AGENT = textwrap.dedent("""\
    set -e
    d=$(printf 'd\\376'); x=$(printf 'x\\377'); y=$(printf 'y\\375'); z=$(printf 'z\\374'); e='a\\b \\xff'
    mkdir "$d"
    printf one > "$d/$x"
    printf two > "$e"
    printf gone > "$z"
    sleep 0.5
    mv "$d/$x" "$d/$y"
    rm "$z"
    cat "/data/private/$x" 2>/dev/null || true
""")
"""An agent whose names are not UTF-8: a directory, a file in it renamed, a file whose name has
backslashes and looks like an escape (``a\\b \\xff``), a file made and deleted, and a program whose
argv holds such bytes (and names a private path, which the audit shows). The pause lets the shim's
watcher read the files before they move."""


def _amb(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _get(url: str, path: str) -> Any:
    with urlopen(url + path, timeout=60) as r:
        return json.loads(r.read())


def _facts(store: Path, run_id: str) -> dict[str, Any]:
    """The shim's file and process facts of a run, from its (ingested) spool."""
    kinds: dict[str, list[Any]] = {}
    for e in shim_events(store, run_id):
        kinds.setdefault(e.kind, []).append(e.payload)
    return {
        "written": {p.path for p in kinds.get("file.written", [])},
        "renamed": {(p.src, p.dst) for p in kinds.get("file.renamed", [])},
        "deleted": {p.path for p in kinds.get("file.deleted", [])},
        "argv": [p.argv for p in kinds.get("process.exited", [])],
        "lost": [n.text for n in kinds.get("note", []) if "could not" in n.text],
    }


class TestLocalBackend(BackendContract):
    shim = False

    def make(self) -> Backend:
        return LocalBackend()

    def test_command_not_found_says_so(self) -> None:
        _, ev, _, _ = self.run(["no-such-agent-binary-xyz"], "missing-reason")
        assert "command not found" in ev["run.finished"].reason

    def test_an_agent_without_a_handler_dies_of_the_sigterm(self) -> None:
        out, ev, _, _ = self.run(["sleep", "30"], "plain-term", time_limit_s=0.5)
        assert (out.status, out.exit_code) == ("timeout", 124)
        assert ev["process.exited"].signal == signal.SIGTERM and out.duration_s < 10

    def test_background_children_do_not_outlive_the_run(self) -> None:
        # The agent leaves a child behind and exits: the run ends with it (leftovers() checks). The
        # child is found by its argv: a pid the agent sees may be one of its own PID namespace.
        nap = f"60.{secrets.randbelow(10**9)}"
        out, _, _, _ = self.run(f"sleep {nap} & echo up > {READY}", "orphan")
        assert out.status == "completed"
        assert running_with(f"sleep\0{nap}\0".encode()) == []

    def test_the_agent_sees_only_its_own_processes(self) -> None:
        # Its own PID namespace (recorder/isolation.py): this machine allows it, so the contract
        # above held with the agent isolated, and the run says so.
        _, ev, _, _ = self.run("ls /proc > procs.txt", "procs")
        listing = self.sealed(ev)["procs.txt"] or b""
        pids = sorted(int(name) for name in listing.split() if name.isdigit())
        assert pids[0] == 1 and len(pids) <= 4, pids  # its init, sh, ls
        isolation = ev["run.started"].isolation
        assert (isolation.kind, isolation.requested, isolation.reason) == ("namespaces", "best-effort", None)

    def leftovers(self, backend: Any, run_id: str) -> list[str]:
        # No process of the run survives it: its agents all ran with the run's workspace as cwd.
        left = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and os.readlink(proc / "cwd") == str(self.ws):
                    left.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
        return left


class TestLocalBackendWithShim(BackendContract):
    """``amb-record --shim``: the local backend with the agent under the shim, as in a container."""

    def make(self) -> Backend:
        return LocalBackend(shim=True)

    leftovers = TestLocalBackend.leftovers

    def test_an_agent_that_kills_its_process_group_and_the_shim_in_it_is_a_recorder_error(self):
        # The shim is the agent's parent, in its process group: the agent can kill both at once,
        # and whatever it did after that is not on the record. The run must not look complete.
        _, ev, _, _ = self.run("echo seen > before.txt; kill -KILL 0", "killpg")
        finished = ev["run.finished"]
        assert (finished.status, finished.exit_code) == ("recorder_error", 137), finished
        assert finished.reason == (
            "the shim ended before its final report: what the agent did after its last record is missing"
        )


class TestDockerBackend(BackendContract):
    @pytest.fixture(autouse=True)
    def _image(self, agent_image: str) -> None:
        self.image = agent_image

    def make(self) -> Backend:
        return DockerBackend(self.image, stream_output=False, linger=0.5)

    def _ready(self) -> bool:
        workspace = self.backend_workspace()
        return workspace is not None and (workspace / READY).exists()

    def backend_workspace(self) -> Path | None:
        if self.current is None:
            return None
        found = sorted(Path(tempfile.gettempdir()).glob(f"amb-docker-{self.current}-*/workspace"))
        return found[0] if found else None

    def leftovers(self, backend: Any, run_id: str) -> list[str]:
        client = backend.client
        left = [
            c.name
            for c in client.containers.list(
                all=True, filters={"label": f"org.amb.run={run_id}"}, ignore_removed=True
            )
        ]
        left += [n.name for n in client.networks.list(names=[backend.network_name])]
        left += [str(p) for p in Path(tempfile.gettempdir()).glob(f"amb-docker-{run_id}-*")]
        if shutil.which("iptables"):
            rules = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True).stdout
            left += [line for line in rules.splitlines() if backend.network_name in line]
        return left
