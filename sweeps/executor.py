"""The executor seam: an engine that decides *where* ``amb sweep exec SPEC.json`` runs. It never
records anything nor decides a cell's outcome (the shard root does, ``sweeps.shard``); the protocol
and the rules for implementers are in docs/scale-out.md (The executor protocol).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import socket
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import msgspec

from schemas.durable import read_small, write_durably
from schemas.errors import AmbError, UsageError
from sweeps.shard import Layout

JobState = Literal["queued", "running", "ended"]
ExecutorName = Literal["local", "slurm", "ray", "k8s"]

EXECUTORS: dict[str, str] = {
    "local": "sweeps.local:LocalExecutor",
    "slurm": "sweeps.slurm:SlurmExecutor",
    "ray": "sweeps.ray:RayExecutor",
}
"""Executor name -> ``module:class``; imported only when used (Ray is an optional extra)."""


class LocalOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    concurrency: int | None = None
    """Runs at the same time (default: the sweep file's ``concurrency``)."""


class SlurmOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    """``sbatch --time`` (default: from each run's time limit, plus a margin)."""
    array_cap: int | None = None
    """At most this many array tasks at once (``--array=0-N%K``): the rate limit of a sweep."""
    gpus_per_task: int | None = None
    """Default: each run spec's ``limits.gpus``."""
    gres: str | None = None
    """``--gres`` for GPU runs (default ``gpu:N``)."""
    extra: list[str] = msgspec.field(default_factory=list)
    """More ``sbatch`` arguments, verbatim (``--qos=...``, ``--constraint=...``)."""


class RayOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    address: str | None = None
    """``ray://`` or ``host:port`` of an existing cluster (default: ``RAY_ADDRESS``)."""
    max_in_flight: int | None = None
    """Tasks submitted but not ended, at most (default: the sweep's ``concurrency``)."""
    docker_slots: float = 1.0
    """How much of each node's custom ``docker`` resource one run takes."""


class K8sOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    image: str = "amb-recorder:latest"
    """An image with amb installed (it runs ``amb sweep exec``)."""
    agent_image: str = "amb-agent:latest"
    namespace: str = "default"
    volume_claim: str = "amb-sweep"
    """A ReadWriteMany PersistentVolumeClaim mounted at the shard root's path in every pod."""
    parallelism: int | None = None
    """Pods at once (default: the sweep's ``concurrency``)."""


class ExecutorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The sweep file's ``[executor]`` table: which executor, and each one's options."""

    name: ExecutorName = "local"
    local: LocalOptions = msgspec.field(default_factory=LocalOptions)
    slurm: SlurmOptions = msgspec.field(default_factory=SlurmOptions)
    ray: RayOptions = msgspec.field(default_factory=RayOptions)
    k8s: K8sOptions = msgspec.field(default_factory=K8sOptions)


class Executor(Protocol):
    name: str

    def submit(self, specs: Sequence[Path]) -> None:
        """Have the engine execute these spec files (each under ``layout.specs``)."""

    def poll(self) -> dict[str, JobState]:
        """What the engine knows of every spec submitted so far, by run id; may also start work."""

    def cancel(self) -> None:
        """Stop everything submitted (SIGTERM to each exec, which stops its container)."""

    def close(self) -> None:
        """Let go of the engine (connections, files); running work is left alone."""

    def describe(self) -> dict[str, Any]:
        """Engine-level facts for ``amb sweep status --json`` (job ids, address, counts)."""


class QueuedExecutor:
    """What the local and the Ray executor share: submitted spec files wait in ``queue`` until the
    engine has room (``_start_queued``, the executor's own); ``states`` says what became of each."""

    def __init__(self) -> None:
        self.queue: list[Path] = []
        self.states: dict[str, JobState] = {}
        self.dispatched: dict[str, float] = {}
        """Run id -> when its exec was started (time.time(); the benchmark's dispatch time)."""

    def submit(self, specs: Sequence[Path]) -> None:
        for spec in specs:
            self.queue.append(spec)
            self.states[spec.stem] = "queued"
        self._start_queued()

    def _start_queued(self) -> None:
        raise NotImplementedError

    def _drop_queued(self) -> None:
        """On cancel: the specs not started yet never will be."""
        self.queue.clear()
        self.states.update({r: "ended" for r, s in self.states.items() if s == "queued"})


def executor_class(name: str) -> Any:
    try:
        module_name, cls_name = EXECUTORS[name].split(":")
    except KeyError:
        raise UsageError(f"unknown executor {name!r} (known: {', '.join(sorted(EXECUTORS))})") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"executor {name} is not available here: {e}") from None
    return getattr(module, cls_name)


def open_executor(config: ExecutorConfig, layout: Layout, *, concurrency: int) -> Executor:
    if config.name == "k8s":
        raise UsageError("the k8s executor only writes manifests: use `amb sweep --executor k8s --emit DIR`")
    executor: Executor = executor_class(config.name)(config, layout, concurrency=concurrency)
    return executor


def attach(layout: Layout) -> Executor | None:
    """The executor that last ran this shard root, rebuilt from its saved state (None: none saved)."""
    state = layout.root / "executor" / "name"
    try:
        name = read_small(state, 256).decode("utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise UsageError(f"{state}: cannot read which executor runs the sweep: {why}") from None
    executor: Executor = executor_class(name).attach(layout)
    return executor


StateT = TypeVar("StateT", bound=msgspec.Struct)


def save_state(layout: Layout, name: str, state: msgspec.Struct) -> None:
    """What executor ``name`` needs to cancel from another process (``attach``), on disk."""
    write_durably(layout.root / "executor" / f"{name}.json", msgspec.json.encode(state))


def load_state(
    layout: Layout, name: str, kind: type[StateT], broken: type[AmbError] | None = None, title: str = ""
) -> StateT:
    """An executor's saved state; a new one when none was saved. One that cannot be read is a
    ``broken`` error naming the executor (``title``) or, with no ``broken``, a new state."""
    path = layout.root / "executor" / f"{name}.json"
    try:
        return msgspec.json.decode(read_small(path), type=kind)
    except FileNotFoundError:
        return kind()
    except (OSError, msgspec.DecodeError) as e:
        if broken is None:
            return kind()
        raise broken(f"{path}: cannot read the {title or name} executor's state: {e}") from None


class Attached:
    """An executor's sweep seen from another process (``amb sweep status`` / ``cancel``): what its
    saved state says. It submits nothing; each executor says how it lists and cancels."""

    name = title = ""

    def __init__(self, layout: Layout):
        self.layout = layout

    def submit(self, specs: Sequence[Path]) -> None:
        raise NotImplementedError(f"an attached {self.title} executor only reads and cancels")

    def poll(self) -> dict[str, JobState]:
        return {}

    def close(self) -> None:
        pass


DRIVER_MARK = "driver.lock"
"""``<root>/executor/driver.lock``: the file a running driver holds open (``is_driver``)."""


def hold_driver_mark(layout: Layout) -> int:
    """Open the root's driver mark for as long as the driver runs; returns its descriptor.

    A pid saved in an executor's state is only a number someone may have written: ``amb sweep
    cancel`` signals it only while that process holds this very file open (``is_driver``)."""
    path = layout.root / "executor" / DRIVER_MARK
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        raise UsageError(f"{path}: cannot open the sweep's driver mark: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{path}: the sweep's driver mark is not a regular file")
    return fd


def holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open, ``path`` being a regular file of this user with one
    link: a symbolic or hard link planted in the sweep's directory names no other process's file."""
    if pid <= 0:
        return False
    try:
        mine = os.lstat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    if not stat.S_ISREG(mine.st_mode) or mine.st_nlink != 1 or mine.st_uid != os.geteuid():
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            held = os.stat(f"/proc/{pid}/fd/{fd}")
            if (held.st_dev, held.st_ino) == (mine.st_dev, mine.st_ino):
                return True
    return False


def is_driver(layout: Layout, pid: int | None) -> bool:
    return pid is not None and holds_open(pid, layout.root / "executor" / DRIVER_MARK)


def stop_driver(layout: Layout, pid: int | None, host: str | None) -> None:
    """SIGTERM to the sweep's driver running on this machine (it cancels its runs, submits no more);
    a pid that is not this root's driver (``is_driver``) is left alone."""
    if pid and host == socket.gethostname() and is_driver(layout, pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def save_name(layout: Layout, name: str) -> Path:
    """Record which executor owns the shard root; returns the executor's own state directory."""
    d = layout.root / "executor"
    d.mkdir(parents=True, exist_ok=True)
    (d / "name").write_text(name + "\n", encoding="utf-8")
    return d


def exec_command(spec_file: Path) -> list[str]:
    """The one command every executor runs for a spec, by the ``amb`` beside this interpreter (a
    virtual environment's), else the one on PATH."""
    exe = Path(sys.executable).with_name("amb")
    amb = str(exe) if exe.exists() else (shutil.which("amb") or "amb")
    return [amb, "sweep", "exec", str(spec_file)]
