"""The docker backend: the agent runs in a container whose only way out is the recording proxy.

Per run it creates an ``--internal`` bridge network, whose gateway address alone the proxy binds
(and, as root with iptables, a host firewall rule refusing all else the container sends to the
host), a fresh workspace at ``/workspace`` (the tier's brief in it), ``DIR/public`` read-only at
``/data/public`` (``DIR/private`` is never mounted), the per-run CA as the only trust bundle, and
the shim's receiver socket. The shim runs the agent as an unprivileged uid under its tracer and
streams what it does to the receiver. What the container guarantees, and why: docs/containers.md.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recorder.backend import AgentView, Exit, RunContext, seal_directory
from recorder.data_view import public_view
from recorder.host_firewall import HostFirewall
from recorder.runlock import RunLock
from recorder.shim.local import shim_argv
from recorder.shim.receiver import ShimReceiver
from recorder.shim.shim import DEFAULT_CAP
from schemas.errors import AmbError
from schemas.events import Isolation, SubmissionSealed
from schemas.tempdirs import make_tempdir, remove_tempdir

DEFAULT_IMAGE = "amb-agent:latest"
AGENT_UID = 1000
CONTAINER_WORKSPACE = "/workspace"
CONTAINER_DATA = "/data/public"
CONTAINER_CA_DIR = "/etc/amb/ca"
CONTAINER_SOCK_DIR = "/run/amb/sock"
CONTAINER_SHIM_DIR = "/run/amb/shim"
"""The shim's own files: a tmpfs owned by root, mode 0700, that the agent's uid cannot enter."""
BRIEF_NAME = "tier_prompt.txt"
"""Where AutoMedBench's orchestrator puts the tier's prompt; agents written for it look there."""

FORBIDDEN_WATCH = ("/data/private", "/eval", "/results")
"""Paths whose opens the shim records if they ever exist inside the container."""

OUTSIDE_WRITES = ("/tmp", "/home/agent", "/dev/shm")
"""Every place the agent can write besides the workspace (the root filesystem is read-only): writes
there are recorded by absolute path. Nothing in them is skipped: the shim's own files live in
``CONTAINER_SHIM_DIR``, which the agent cannot write to."""

SHIM_ENTRY = (
    "import sys; sys.path.insert(0, '/opt/amb/lib'); "
    "from recorder.shim.__main__ import main; sys.exit(main())"
)

# What the shim (root in the container) needs, and nothing more: switch to the agent's uid, read
# the agent's files whatever their modes, kill processes that outlive the agent, and trace the
# agent's processes (read an exec's argv from their memory, learn their exit status). The agent
# itself runs as an unprivileged uid under no-new-privileges, so none of these reach it.
CAPS = ["SETUID", "SETGID", "KILL", "DAC_OVERRIDE", "DAC_READ_SEARCH", "SYS_PTRACE"]


class DockerBackendError(AmbError):
    """The container, its network or its mounts could not be set up."""


@dataclass
class ContainerResources:
    """What the agent's container may use: CPUs, memory, processes and the size of its tmpfs mounts."""

    cpus: float | None = 2.0
    memory: str | None = "8g"
    pids: int | None = 4096
    tmp_size: str | None = None
    """Of /tmp and of /home/agent each (tmpfs: charged to the container's memory). By default 2g, or
    a quarter of the memory limit when that is less, so that both mounts and /dev/shm fit in it."""

    def __post_init__(self) -> None:
        if self.tmp_size is None:
            fits = _size(self.memory) // 4 if self.memory else DEFAULT_TMP_SIZE
            self.tmp_size = f"{min(DEFAULT_TMP_SIZE, fits) >> 20}m"
        # What an agent leaves in a tmpfs stays charged to the container when its processes are
        # killed: with the tmpfs mounts above the memory limit, the OOM killer would find nothing to
        # free, and the shim could wait for memory forever.
        if self.memory and 2 * _size(self.tmp_size) + SHM_SIZE >= _size(self.memory):
            raise DockerBackendError(
                f"tmpfs of {self.tmp_size} for /tmp and /home/agent each, and /dev/shm, do not fit in the "
                f"memory limit of {self.memory}: give the tmpfs less or the memory more"
            )


@dataclass
class _Handle:
    container: Any  # a docker SDK Container (the SDK has no type information)
    exited: threading.Event = field(default_factory=threading.Event)
    status: int | None = None
    killed: bool = False
    streamer: threading.Thread | None = None


class DockerBackend:
    name = "docker"

    def __init__(
        self,
        image: str | None = None,
        *,
        resources: ContainerResources | None = None,
        gpus: str | None = None,
        content_cap: int = DEFAULT_CAP,
        brief: str | None = None,
        client=None,
        host_firewall: bool | None = None,
        stream_output: bool = True,
        linger: float = 2.0,
        labels: dict[str, str] | None = None,
    ):
        self.image = image or os.environ.get("AMB_AGENT_IMAGE") or DEFAULT_IMAGE
        self.resources = resources or ContainerResources()
        self.gpus = gpus if gpus is not None else (os.environ.get("AMB_GPUS") or None)
        self.content_cap = content_cap
        self.brief = brief
        self.stream_output = stream_output
        self.linger = linger
        self.extra_labels = dict(labels or {})
        """Put on the container beside amb's own (a sweep finds and stops its containers by them)."""
        self._client = client
        self._own_client = client is None
        """A client this backend made is closed with it (its pooled connections to dockerd)."""
        self._want_firewall = host_firewall
        self._firewall = HostFirewall()
        self._network: Any = None  # a docker SDK Network, once created
        self._gateway: str | None = None
        self._ctx: RunContext | None = None
        self._tmp: Path | None = None
        self._workspace: Path | None = None
        self._receiver: ShimReceiver | None = None
        self._uid = self._gid = AGENT_UID
        self._closed = False
        self._container = None
        self._container_name = ""
        self._data_mount: Path | None = None
        self._data_view = "none"
        self._token = secrets.token_hex(4)
        self._lock: RunLock | None = None
        # The orchestrator closes a backend only once it has a handle; if preparing or starting
        # failed, this still removes the network, the container and the temporary directories.
        atexit.register(self._release)

    def claim(self, lock: RunLock) -> None:
        """The run's lock: its labels go on every resource, its temp dir is listed in it (``amb gc``)."""
        self._lock = lock
        lock.note("backend", "docker")

    @property
    def _labels(self) -> dict[str, str]:
        return dict(self._lock.labels) if self._lock is not None else {}

    def _release(self) -> None:
        if not self._closed:
            self.close(None)

    @property
    def client(self):
        if self._client is None:
            try:
                import docker

                self._client = docker.from_env(timeout=120)
                self._client.ping()
            except Exception as e:
                raise DockerBackendError(
                    f"--backend docker: cannot reach a docker daemon ({e.__class__.__name__}: {e}); "
                    "start dockerd (CI: .ci/dockerd.sh) or set DOCKER_HOST"
                ) from None
        return self._client

    def proxy_listen_host(self) -> str:
        """Create the run's internal network; the proxy binds its gateway address."""
        import docker.errors

        if self._gateway is not None:
            return self._gateway
        name = self.network_name
        try:
            self._network = self.client.networks.create(
                name,
                driver="bridge",
                internal=True,
                labels={"org.amb.backend": "docker", **self._labels},
                options={"com.docker.network.bridge.name": name},
            )
            self._network.reload()
            self._gateway = self._network.attrs["IPAM"]["Config"][0]["Gateway"].split("/")[0]
        except (docker.errors.APIError, KeyError, IndexError) as e:
            self._drop_network()
            raise DockerBackendError(f"cannot create the run's internal network: {e}") from None
        return self._gateway

    def prepare(self, ctx: RunContext) -> AgentView:
        import docker.errors

        self._ctx = ctx
        if self._gateway is None:
            self.proxy_listen_host()
        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise DockerBackendError(
                f"image {self.image} not found: build it with `amb images build`"
            ) from None
        if ctx.data_dir is not None and not (Path(ctx.data_dir) / "public").is_dir():
            raise DockerBackendError(
                f"--data {ctx.data_dir}: no public/ folder in it (only DIR/public reaches the agent)"
            )
        if os.geteuid() != 0:  # the agent runs as the invoking user: its files stay the user's
            self._uid, self._gid = os.geteuid(), os.getegid()

        # Named in the run's lock (or, used without one, this process's) before it exists: whoever
        # cleans up after a killed recorder finds it there.
        make = self._lock.make_tempdir if self._lock is not None else make_tempdir
        self._tmp = make(f"amb-docker-{ctx.run_id}-")
        self._workspace = self._tmp / "workspace"
        self._workspace.mkdir()
        brief = self._brief_text(ctx)
        if brief is not None:
            (self._workspace / BRIEF_NAME).write_text(brief)
        if os.geteuid() == 0:
            for path in [self._workspace, *self._workspace.iterdir()]:
                os.chown(path, self._uid, self._gid)
        if ctx.data_dir is not None:
            self._data_mount, self._data_view = public_view(Path(ctx.data_dir) / "public", self._tmp)
        ca_dir = self._tmp / "ca"
        ca_dir.mkdir()
        # The container trusts the per-run CA and nothing else: everything it can reach is the proxy.
        (ca_dir / "bundle.pem").write_bytes(Path(ctx.ca_cert).read_bytes() if ctx.ca_cert else b"")
        os.chmod(ca_dir / "bundle.pem", 0o644)
        sock_dir = self._tmp / "sock"
        sock_dir.mkdir(mode=0o700)
        self._receiver = ShimReceiver(
            ctx.store, ctx.run_id, sock_dir, blobs=ctx.blobs, content_cap=self.content_cap
        ).start()
        self._apply_firewall(ctx)
        assert self._gateway is not None, "prepare() made the network and read its gateway"
        return AgentView(
            proxy_host=self._gateway,
            ca_bundle=f"{CONTAINER_CA_DIR}/bundle.pem",
            workspace=CONTAINER_WORKSPACE,
            isolation=Isolation(kind="container"),
            data=CONTAINER_DATA if self._data_mount is not None else None,
        )

    def _brief_text(self, ctx: RunContext) -> str | None:
        if self.brief is not None:
            return self.brief
        if not (ctx.task and ctx.tier):
            return None
        # recorder may not import tasks/; the briefs are plain files next to the task specs.
        path = Path(__file__).resolve().parent.parent / "tasks" / ctx.task / f"{ctx.tier}.md"
        return path.read_text() if path.is_file() else None

    def start(self, argv: list[str], env: dict[str, str]) -> _Handle:
        import docker.errors

        assert self._ctx is not None and self._tmp is not None, "prepare() first"
        # Named before it exists: a stop signal that lands while dockerd creates it still finds it.
        self._container_name = f"amb-{self._ctx.run_id}-{self._token}"[:63]
        options = self._container_options(argv, env)
        try:
            container = self._container = self.client.containers.create(**options)
            handle = _Handle(container)
            container.start()
        except docker.errors.APIError as e:
            raise DockerBackendError(f"cannot start the agent container: {e.explanation or e}") from None
        if self.stream_output:
            handle.streamer = threading.Thread(target=_stream_output, args=(container,), daemon=True)
            handle.streamer.start()
        threading.Thread(target=self._wait_exit, args=(handle,), daemon=True).start()
        return handle

    def _shim_command(self, argv: list[str]) -> list[str]:
        """The container's command: the shim, as root, running ``argv`` as the agent's uid."""
        ids = ["--agent-uid", str(self._uid), "--agent-gid", str(self._gid)]
        return shim_argv(
            f"{CONTAINER_SOCK_DIR}/shim.sock",
            CONTAINER_WORKSPACE,
            # Docker's API holds UTF-8 text: an argument that is not (any bytes are a Linux argument)
            # would reach the container changed. As hex, each reaches the shim as the bytes it is.
            [os.fsencode(a).hex() for a in argv],
            entry=("/opt/venv/bin/python", "-I", "-c", SHIM_ENTRY),
            content_cap=self.content_cap,
            watched=FORBIDDEN_WATCH,
            outside=OUTSIDE_WRITES,
            private_dir=CONTAINER_SHIM_DIR,
            flags=[*ids, "--linger", str(self.linger), "--stop-on-oom", "--hex-command"],
        )

    def _container_options(self, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        """What the container is created with: its mounts, its confinement and its resources."""
        assert self._ctx is not None and self._tmp is not None
        volumes = {
            str(self._workspace): {"bind": CONTAINER_WORKSPACE, "mode": "rw"},
            str(self._tmp / "ca"): {"bind": CONTAINER_CA_DIR, "mode": "ro"},
            str(self._tmp / "sock"): {"bind": CONTAINER_SOCK_DIR, "mode": "ro"},
        }
        if self._data_mount is not None:
            volumes[str(self._data_mount)] = {"bind": CONTAINER_DATA, "mode": "ro"}
        kwargs: dict[str, Any] = dict(
            image=self.image,
            command=self._shim_command(argv),
            environment=dict(env),
            network=self._network.name,
            volumes=volumes,
            working_dir=CONTAINER_WORKSPACE,
            init=True,
            detach=True,
            security_opt=["no-new-privileges"],
            cap_drop=["ALL"],
            cap_add=CAPS,
            read_only=True,
            tmpfs={
                "/tmp": f"size={self.resources.tmp_size},mode=1777",
                "/home/agent": f"size={self.resources.tmp_size},mode=1777",
                CONTAINER_SHIM_DIR: "size=16m,mode=0700",
            },
            labels={**self.extra_labels, "org.amb.run": self._ctx.run_id, **self._labels},
            name=self._container_name,
            user="0:0",
        )
        if self.resources.cpus:
            kwargs["nano_cpus"] = int(self.resources.cpus * 1e9)
        if self.resources.memory:
            kwargs["mem_limit"] = self.resources.memory
        if self.resources.pids:
            kwargs["pids_limit"] = self.resources.pids
        if self.gpus:
            kwargs["device_requests"] = [_gpu_request(self.gpus)]
        return kwargs

    def _wait_exit(self, handle: _Handle) -> None:
        try:
            handle.status = int(handle.container.wait()["StatusCode"])
        except Exception:
            handle.status = 125  # the daemon lost the container: report it as a failed start
        handle.exited.set()

    def wait(self, handle: _Handle, timeout: float | None) -> Exit | None:
        if not handle.exited.wait(timeout):
            return None
        if handle.streamer is not None:
            handle.streamer.join(timeout=5)
        code = handle.status if handle.status is not None else 125
        if handle.killed and code == 137:
            return Exit(code=137, signal=9)
        lost = self._receiver.lost(" inside the container") if self._receiver is not None else None
        return Exit(code=code, failure=self._out_of_memory(handle), lost=lost)

    def _out_of_memory(self, handle: _Handle) -> str | None:
        """The run's reason when the kernel's OOM killer killed a process in the container. Whichever
        it took, the shim's or the agent's, the run ended there (``recorder.shim.oomwatch``): the same
        words for both."""
        try:
            handle.container.reload()
            oom = bool(handle.container.attrs["State"].get("OOMKilled"))
        except Exception:  # the daemon lost the container: its exit code is all there is
            return None
        if not oom:
            return None
        return (
            f"the container ran out of memory (limit {self.resources.memory}): the kernel's OOM killer "
            "killed a process, and the run was stopped there (the recorder shares that limit)"
        )

    def send_signal(self, handle: _Handle, sig: int) -> None:
        # PID 1 is docker's init: it forwards to the shim, which forwards to the agent.
        with contextlib.suppress(Exception):
            handle.container.kill(signal=int(sig))

    def kill(self, handle: _Handle) -> None:
        handle.killed = True
        with contextlib.suppress(Exception):
            handle.container.kill()

    def pid(self, handle: _Handle) -> int | None:
        try:
            handle.container.reload()
            return int(handle.container.attrs["State"]["Pid"]) or None
        except Exception:
            return None

    def seal_submission(self, handle: _Handle) -> SubmissionSealed:
        assert self._ctx is not None and self._workspace is not None
        # The shim's last events (the final reconcile) are in before the workspace is sealed.
        if self._receiver is not None:
            self._receiver.wait(timeout=15)
        return seal_directory(self._workspace, self._ctx.blobs, shown_root=CONTAINER_WORKSPACE)

    def close(self, handle: _Handle | None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            container = handle.container if handle is not None else self._container
            with contextlib.suppress(Exception):  # never created, or already gone
                if container is None and self._container_name:
                    # Stopped while dockerd was creating it: it may exist without our knowing it.
                    container = self.client.containers.get(self._container_name)
                if container is not None:
                    container.remove(force=True)
            if self._receiver is not None:
                self._receiver.close(timeout=5)
        finally:
            self._firewall.remove()
            self._drop_network()
            if self._tmp is not None:
                remove_tempdir(self._tmp)
            atexit.unregister(self._release)  # (it held this backend, its client and its run, to exit)
            if self._own_client and self._client is not None:
                self._client.close()
                self._client = None

    def tool_versions(self) -> dict[str, str]:
        out = {"image": self.image, "host_firewall": "on" if self._firewall.rules else "off"}
        out["data_view"] = self._data_view
        if self._gateway and self._ctx is not None:
            # The only address the container may connect to: the auditor calls any other connect the
            # shim saw a direct egress attempt.
            ports = ",".join(str(p) for p in sorted(set(self._ctx.proxy_ports.values())))
            out["proxy_address"] = f"{self._gateway}:{ports}"
        with contextlib.suppress(Exception):
            out["image_id"] = self.client.images.get(self.image).id
            out["docker"] = str(self.client.version().get("Version", ""))
        return out

    @property
    def workspace(self) -> Path | None:
        return self._workspace

    @property
    def network_name(self) -> str:
        """The run's network (and bridge) name, also after it has been removed."""
        return f"amb-{self._token}"

    def _apply_firewall(self, ctx: RunContext) -> None:
        """Refuse whatever the container sends to the host, except to the proxy's ports
        (``recorder.host_firewall``): when asked to, or by default as root with iptables."""
        want = self._want_firewall
        if want is None:
            want = os.geteuid() == 0 and shutil.which("iptables") is not None
        if not want:
            return
        ports = sorted(set(ctx.proxy_ports.values()))
        failed = self._firewall.install(self._network.name, ports, ctx.run_id)
        if failed is not None and self._want_firewall:
            raise DockerBackendError(f"cannot install the host firewall rule: {failed}")

    def _drop_network(self) -> None:
        if self._network is not None:
            with contextlib.suppress(Exception):
                self._network.remove()
            self._network = None


SHM_SIZE = 64 << 20
"""Docker's /dev/shm (a tmpfs, charged to the container's memory like /tmp)."""
DEFAULT_TMP_SIZE = 2 << 30


def _size(text: str) -> int:
    """Bytes in a docker size (``512m``, ``8g``; a bare number is bytes)."""
    units = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower()
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _gpu_request(spec: str):
    """``all``, a count (``2``), device ids (``0,1``) or ``device=0`` (one id, which a bare ``0`` would
    read as a count), as ``docker run --gpus`` takes them."""
    import docker.types

    if spec == "all" or spec.isdigit():
        return docker.types.DeviceRequest(count=-1 if spec == "all" else int(spec), capabilities=[["gpu"]])
    return docker.types.DeviceRequest(
        device_ids=spec.removeprefix("device=").split(","), capabilities=[["gpu"]]
    )


def _stream_output(container) -> None:
    """The agent's stdout/stderr go to ours, as the local backend's would."""
    with contextlib.suppress(Exception):
        for out, err in container.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True):
            for data, stream in ((out, sys.stdout), (err, sys.stderr)):
                if data:
                    stream.buffer.write(data)
                    stream.flush()
