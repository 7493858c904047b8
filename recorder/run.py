"""Run orchestration for ``amb-record``: proxy, agent environment, backend, signals, time limit.

``record(spec, backend)`` runs one agent and returns its outcome (the backend seam is
``recorder.backend``); ingesting into DuckDB is the CLI's job (``amb.record``), since ``recorder``
may not import ``replay``.

Ordering matters: the proxy starts before the agent and stops only after the agent has exited
(mitmproxy cuts streams still in flight when it stops); ``run.finished`` is always the last
``recorder`` event, written even when the recorder itself failed.
"""

from __future__ import annotations

import os
import platform
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from recorder.backend import AgentView, Backend, RunContext
from recorder.budget import Budget, limited, recorded
from recorder.isolation import unprotected_warning
from recorder.keyguard import guard_this_process, local_warning
from recorder.local_backend import LocalBackend
from recorder.proxy import upstreams as upstreams_mod
from recorder.proxy.upstreams import Upstream
from recorder.runlock import RunLock, StaleRunLock
from recorder.spool import SpoolWriter, spool_path
from recorder.supervise import stop_signals_held, supervise
from recorder.watchdog import Watchdog
from schemas.blobstore import BlobStore
from schemas.codec import check_id
from schemas.errors import AmbError, SchemaError, UsageError
from schemas.events import BudgetLimits, Payload, ProcessExited, RunFinished, RunStarted, kind_of
from schemas.ostext import os_text, quoting
from schemas.run_claim import require_free
from schemas.tempdirs import remove_tempdir

if TYPE_CHECKING:
    from collections.abc import Callable


TIMEOUT_EXIT_CODE = 124
"""What ``timeout(1)`` returns; scripts already know it."""

DEFAULT_GRACE_S = 5.0
"""Between the time limit's SIGTERM and SIGKILL."""


class Stopped(BaseException):
    """A stop signal turned into an exception by whoever runs the recorder (``amb sweep exec``) while
    no agent was running to forward it to: the run is closed as ``killed``, like a run whose agent
    was stopped, not as a recorder failure. The argument is the signal's name."""


@dataclass
class RunSpec:
    argv: list[str]
    store: Path
    run_id: str | None = None
    task: str | None = None
    tier: str | None = None
    data_dir: Path | None = None
    time_limit_s: float | None = None
    grace_s: float = DEFAULT_GRACE_S
    labels: dict[str, str] = field(default_factory=dict)
    agent: str | None = None
    """The agent's name as the user gives it (default: the command's basename)."""
    model: str | None = None
    """The model the agent is told to use, when the user says (the calls name what was called)."""
    upstreams: Mapping[str, str | Upstream] = field(default_factory=dict)
    """By name: ``Upstream``s, or a kind's URL / ``KIND:URL`` (missing default kinds: the public APIs)."""
    workspace: Path | None = None
    """Defaults to the current directory (the local backend's contract)."""
    env: dict[str, str] | None = None
    """Where the real keys are read from (default: this process's environment)."""
    allow_hosts: list[tuple[str, int]] = field(default_factory=list)
    """Destinations the proxy may reach although they are loopback or private (--allow-host)."""
    budget: BudgetLimits | None = None
    """--max-tokens / --max-cost / --max-calls (``recorder.budget``)."""


@dataclass
class Outcome:
    run_id: str
    status: str
    exit_code: int
    duration_s: float
    counts: dict[str, int]
    reason: str | None = None


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


parse_upstreams = upstreams_mod.parse


def parse_allow_hosts(values: list[str]) -> list[tuple[str, int]]:
    """``--allow-host HOST:PORT`` values → (host, port) pairs."""
    from recorder.proxy.gate import parse_host_port

    out = []
    for value in values:
        try:
            out.append(parse_host_port(value))
        except ValueError:
            raise UsageError(f"--allow-host {value!r}: expected HOST:PORT (e.g. 127.0.0.1:8080)") from None
    return out


def parse_labels(values: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise UsageError(f"--label {value!r}: expected K=V")
        if key in labels:
            raise UsageError(f"--label {value!r}: {key!r} is given twice (once as {labels[key]!r})")
        labels[key] = val
    return labels


def agent_env(
    view: AgentView,
    ports: dict[str, int],
    placeholders: dict[str, str],
    run_id: str,
    upstreams: Mapping[str, str | Upstream] | None = None,
) -> dict[str, str]:
    """amb's variables for the agent: where the proxy is, which CA to trust, placeholder keys."""
    host = view.proxy_host
    proxy = f"http://{host}:{ports['regular']}"
    no_proxy = ",".join(dict.fromkeys([host, "localhost", "127.0.0.1", "::1"]))
    env: dict[str, str] = {}
    for name, up in upstreams_mod.resolve(upstreams or {}).items():
        # Each upstream's base URL ends as its SDK expects (the openai SDK wants the /v1 in it; the
        # anthropic and google-genai SDKs add their own path).
        env[up.base_url_var] = up.agent_base_url(host, ports[name])
        first, *others = up.key_vars
        env[first] = placeholders[name]
        env.update(dict.fromkeys(others, ""))
    env |= dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), proxy)
    # The reverse endpoints are on the proxy host itself: going through the regular proxy as well
    # would record every call twice.
    env |= {"NO_PROXY": no_proxy, "no_proxy": no_proxy, "AMB_RUN_ID": run_id}
    if view.ca_bundle:
        env |= dict.fromkeys(
            ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"), view.ca_bundle
        )
    return env


def tool_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("amb-recorder", "mitmproxy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "unknown"
    return out


class _RecorderLog:
    """The ``recorder`` source's spool, with counts for ``run.finished``."""

    def __init__(self, store: Path, run_id: str):
        path = spool_path(store, run_id, "recorder")
        require_free(store, run_id, "pick another --run-id")
        self.writer = SpoolWriter(path, run_id, "recorder")
        self.counts: Counter[str] = Counter()

    def append(self, payload: Payload) -> None:
        self.writer.append(payload)
        self.counts[kind_of(type(payload))] += 1


def record(spec: RunSpec, backend: Backend | None = None, *, on_ready=None) -> Outcome:
    """Record one run of ``spec.argv``; returns when the agent has ended and everything is on disk.

    ``on_ready(ports, env)`` (tests) is called once the proxy listens, before the agent starts.
    Raises ``AmbError`` for problems found before the agent started; after that, failures end the
    run with status ``recorder_error``. The run's lock (``recorder.runlock``) is held throughout,
    so ``amb gc`` leaves this run alone."""
    if not spec.argv:
        raise UsageError("no command given: amb-record [options] -- COMMAND ARGS...")
    backend = backend or LocalBackend()
    run_id = spec.run_id or new_run_id()
    try:
        check_id("run id", run_id)
    except SchemaError as e:
        raise UsageError(str(e)) from None
    _collect_garbage(backend)
    try:
        lock = _take_run_lock(run_id)
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    claim = getattr(backend, "claim", None)
    if claim is not None:
        claim(lock)
    watchdog = _start_watchdog(lock)
    try:
        return _Recording(spec, backend, run_id, lock).record(on_ready)
    finally:
        try:
            lock.release()
        finally:
            if watchdog is not None:
                watchdog.release()


def _take_run_lock(run_id: str) -> RunLock:
    """The run's lock; one a recorder of the same run id left when it died since ``_collect_garbage``
    looked is cleaned up after (what it names removed) before it is taken."""
    from recorder.gc import collect

    try:
        return RunLock(run_id)
    except StaleRunLock as stale:
        collect(locks=[stale.path], docker=None)
        return RunLock(run_id)


def _start_watchdog(lock: RunLock) -> Watchdog | None:
    """The process that cleans up after this recorder if it is killed (``recorder.watchdog``)."""
    try:
        return Watchdog.start(lock)
    except OSError as e:
        print(
            f"amb-record: warning: no watchdog ({e.strerror or e}): if amb-record is killed, run `amb gc` "
            "to remove what the run leaves",
            file=sys.stderr,
            flush=True,
        )
        return None


def _collect_garbage(backend: Backend) -> None:
    from recorder.gc import collect

    # Only recorders that shared this one's temp dir: `amb gc` is the command for the whole engine.
    removed, _ = collect(docker=True if backend.name == "docker" else None, everywhere=False)
    by_run: dict[str, list[str]] = {}
    for r in removed:
        if r.kind != "lock":
            by_run.setdefault(r.run_id, []).append(f"{r.kind} {r.name}")
    for run_id, what in by_run.items():
        whose = (
            f"run {run_id} left behind (its recorder is gone)"
            if run_id
            else "amb processes that are gone left"
        )
        print(f"amb-record: removed what {whose}: {', '.join(what)}", file=sys.stderr, flush=True)


class _Recording:
    """One run from the proxy's start to ``run.finished``. Setting it up starts nothing; once the
    run has started, whatever happens ends it with a ``run.finished`` that says how."""

    def __init__(self, spec: RunSpec, backend: Backend, run_id: str, lock: RunLock):
        from recorder.proxy.custody import Custody
        from recorder.proxy.server import ProxyServer
        from recorder.proxy.sink import Sink

        self.spec, self.backend, self.run_id, self.lock = spec, backend, run_id, lock
        self.limits = spec.budget if limited(spec.budget) else None
        self.budget = Budget(self.limits, run_model=spec.model) if self.limits is not None else None
        spec.store.mkdir(parents=True, exist_ok=True)
        self.blobs = BlobStore(spec.store / "blobs")
        self.log = _RecorderLog(spec.store, run_id)
        env_source = os.environ if spec.env is None else spec.env
        self.upstreams = upstreams_mod.resolve(spec.upstreams)
        self.custody = Custody.from_env(dict(env_source), self.upstreams)
        # Whoever holds a real key is closed to the agent's reads (/proc environ and mem, ptrace).
        self.guarded = guard_this_process() if self.custody.real else False
        self.tmp = lock.make_tempdir(f"amb-{run_id}-")
        self.sink = Sink(spec.store, run_id, self.custody, budget=self.budget)
        upstream_ca = env_source.get("AMB_UPSTREAM_CA")
        self.proxy = ProxyServer(
            self.sink,
            upstreams=self.upstreams,
            confdir=self.tmp / "ca",
            listen_host=backend.proxy_listen_host(),
            upstream_ca=Path(upstream_ca) if upstream_ca else None,
            allow_hosts=spec.allow_hosts,
        )
        self.handle: object | None = None
        self.t0 = time.monotonic()
        self.status, self.exit_code = "recorder_error", 1
        self.reason: str | None = None

    def record(self, on_ready: Callable[..., object] | None) -> Outcome:
        started = False
        try:
            self.proxy.start()
            view, env = self._prepare_agent()
            run_started = self._run_started(view)
            # Held while run.started is written (its fsync can take long under load): a stop
            # landing there would leave the run started on disk but closed by nobody.
            with stop_signals_held():
                self.log.append(run_started)
                started = True
            if on_ready is not None:
                on_ready(dict(self.proxy.ports), env)
            self._run_agent(view, env)
        except AmbError as e:
            if not started:
                self.cleanup()
                raise
            self.status, self.reason = "recorder_error", str(e)
        except BaseException as e:  # stopped, or a recorder bug: close the run properly, then surface it
            if not started:
                self.cleanup()
                raise
            self.finish(*_ended_by(e))
            raise
        return self.finish(self.status, self.exit_code, self.reason)

    def _prepare_agent(self) -> tuple[AgentView, dict[str, str]]:
        """The backend prepared for the run, and the agent's environment."""
        from recorder.proxy.server import ca_bundle

        spec, backend, proxy = self.spec, self.backend, self.proxy
        ctx = RunContext(
            run_id=self.run_id,
            store=spec.store,
            blobs=self.blobs,
            workspace=(spec.workspace or Path.cwd()).resolve(),
            data_dir=spec.data_dir,
            task=spec.task,
            tier=spec.tier,
            time_limit_s=spec.time_limit_s,
            ca_cert=proxy.ca_cert,
            ca_bundle=ca_bundle(proxy.ca_cert, self.tmp / "ca-bundle.pem"),
            proxy_ports=dict(proxy.ports),
        )
        view = backend.prepare(ctx)
        _warn_what_the_agent_sees(backend, view, list(self.custody.real.values()), self.guarded)
        env = agent_env(view, proxy.ports, self.custody.placeholders, self.run_id, self.upstreams)
        more = {"AMB_TASK": spec.task, "AMB_TIER": spec.tier, "AMB_DATA": view.data}
        return view, env | {k: v for k, v in more.items() if v}

    def _run_started(self, view: AgentView) -> RunStarted:
        spec, backend = self.spec, self.backend
        return RunStarted(
            task=spec.task,
            tier=spec.tier,
            agent=spec.agent or os_text(os.path.basename(spec.argv[0])),
            model=spec.model,
            command=[os_text(a) for a in spec.argv],
            backend=backend.name,
            workspace=os_text(view.workspace),
            time_limit_s=spec.time_limit_s,
            labels=dict(spec.labels),
            tool_versions={**tool_versions(), **backend.tool_versions()},
            budget=recorded(self.limits) if self.limits is not None else None,
            isolation=view.isolation,
        )

    def _run_agent(self, view: AgentView, env: dict[str, str]) -> None:
        """Start the agent, supervise it to its end and record that end (the recorder's own view)."""
        spec, backend = self.spec, self.backend
        start_ns = time.time_ns()
        try:
            self.handle = handle = backend.start(list(spec.argv), env)
        except AmbError as e:  # like a shell: the command could not be run, exit 127
            self.status, self.exit_code, self.reason = "failed", 127, str(e)
            return
        if backend.name == "local":
            # Its own process group, whose leftovers the watchdog kills should amb-record be killed.
            self.lock.note("agent", {"pgid": backend.pid(handle)})
        exit_, self.status, self.reason = supervise(
            backend, handle, spec.time_limit_s, spec.grace_s, self.budget
        )
        end_ns = time.time_ns()
        self.exit_code = TIMEOUT_EXIT_CODE if self.status == "timeout" else exit_.code
        self.log.append(
            ProcessExited(
                pid=backend.pid(handle) or 0,
                ppid=os.getpid(),
                argv=[os_text(a) for a in spec.argv],
                cwd=os_text(view.workspace),
                start_ns=start_ns,
                end_ns=end_ns,
                exit_code=exit_.code if exit_.signal is None else None,
                signal=exit_.signal,
                tracer="recorder",
            )
        )

    def cleanup(self) -> None:
        """Take everything down when the run never started (nothing is written)."""
        try:
            self.proxy.stop()
        finally:
            try:
                self.sink.close()
            finally:
                try:
                    self.backend.close(self.handle)  # also when the agent never started: networks, sockets
                finally:
                    remove_tempdir(self.tmp)  # the CA's private key must not outlive the run

    def finish(self, status: str, exit_code: int, reason: str | None) -> Outcome:
        """Stop the proxy, seal the submission, take the rest down and write ``run.finished``; a
        stop signal that lands meanwhile is held until that is done (``supervise.stop_signals_held``)."""
        with stop_signals_held():
            return self._finish(status, exit_code, reason)

    def _finish(self, status: str, exit_code: int, reason: str | None) -> Outcome:
        log, sink, backend = self.log, self.sink, self.backend
        # The agent has ended: now the proxy may stop (in-flight flows become partial records).
        self.proxy.stop()
        sink.close()
        if sink.broken and status != "recorder_error":
            status, reason = "recorder_error", f"a model call could not be persisted: {sink.broken}"
        budget = sink.budget
        if budget is not None and status != "recorder_error" and budget.exceeded():
            # The budget is why the run ended, whatever the agent did after its calls were refused.
            why = budget.reason()
            status, reason = "budget_exceeded", f"{why}; {reason}" if reason else why
        try:
            if self.handle is not None:
                log.append(backend.seal_submission(self.handle))
        except Exception as e:  # noqa: BLE001 - whatever the agent left, the run still gets its end
            status, reason = "recorder_error", f"cannot seal the submission: {_why(e)}"
        try:
            backend.close(self.handle)
        except Exception as e:  # noqa: BLE001 - the run still gets its end, saying what was not taken down
            why = f"cannot take the run's {backend.name} resources down: {_why(e)}"
            if status != "recorder_error":
                status, reason = "recorder_error", why
        finally:
            remove_tempdir(self.tmp)
        counts = {f"proxy:{k}": v for k, v in sink.counts.items()}
        counts.update({f"recorder:{k}": v for k, v in log.counts.items()})
        duration = time.monotonic() - self.t0
        log.append(
            RunFinished(
                status=status,
                exit_code=exit_code,
                duration_s=round(duration, 3),
                reason=quoting(reason) if reason is not None else None,
                counts=counts,
                budget=sink.budget.spent() if sink.budget is not None else None,
            )
        )
        log.writer.close()
        return Outcome(
            run_id=log.writer.run_id,
            status=status,
            exit_code=exit_code if status != "recorder_error" else (exit_code or 1),
            duration_s=duration,
            counts=counts,
            reason=reason,
        )


def _ended_by(e: BaseException) -> tuple[str, int, str]:
    """How a started run ends when the recorder is stopped, or fails, outside the agent's time."""
    if isinstance(e, (Stopped, KeyboardInterrupt)):  # stopped before the agent started or after it ended
        name = str(e) if isinstance(e, Stopped) else "SIGINT"
        signum = signal.Signals.__members__.get(name, signal.SIGTERM)
        return "killed", 128 + signum, f"amb-record was stopped by {name} while no agent was running"
    return "recorder_error", 1, f"{type(e).__name__}: {e}"  # a recorder bug


def _warn_what_the_agent_sees(backend: Backend, view: AgentView, keys: list[str], guarded: bool) -> None:
    """At the start of a local run: one line if the agent is not isolated from the user's other
    processes (and nobody asked for that), one if real keys stay within its reach."""
    if backend.name != "local":
        return
    lines = [unprotected_warning(view.isolation)] if view.isolation is not None else []
    if keys:
        isolated = view.isolation is not None and view.isolation.kind != "none"
        lines.append(local_warning(keys, guarded, isolated=isolated))
    for line in filter(None, lines):
        print(f"amb-record: warning: {line}", file=sys.stderr, flush=True)


def _why(e: Exception) -> str:
    """An error in one line: ours and the OS's say it themselves; anything else is named by its type."""
    return str(e) if isinstance(e, (AmbError, OSError)) else f"{type(e).__name__}: {e}"
