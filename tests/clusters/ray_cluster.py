"""A real Ray cluster on this one machine, inside a private network namespace with only ``lo`` up.

Ray rewrites a loopback address to the machine's primary address (when it can find one) and then
dials that, so test traffic would leave loopback. Inside a fresh network namespace there is no other
address: Ray falls back to 127.0.0.1 and every connection stays on ``lo``. The cluster (a head node
and one worker node with one logical GPU, each a ``ray start --block`` process whose PID is the whole
node) and every driver that talks to it run in that namespace. Docker still works there: its CLI
and SDK talk to dockerd over the unix socket, which no network namespace hides.

The namespace is held open by one ``unshare --net`` keeper process; every other process joins it with
``nsenter --net=/proc/<keeper>/ns/net``. Teardown stops each node by its PID (SIGTERM drains the
node's own daemons), then the keeper, then removes the temporary directory.

One thing must leave the namespace: each run's ``amb sweep exec``. The docker backend's recording proxy
binds the gateway of the run's own docker network, which exists only in the host's namespace. So the
nodes run from a *view* of the project's virtual environment (its ``pyvenv.cfg`` and ``lib``, another
``bin``) whose ``amb`` enters the namespace of the process that made the cluster, then runs the real
``amb``. The executor finds ``amb`` beside the nodes' Python, as on any cluster; the runs' traffic is
then exactly that of every other docker test (loopback and the run's own docker network).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from schemas.tempdirs import make_tempdir, remove_tempdir

HEAD_PORT = 6390
DASHBOARD_PORT = 8265
GPU_NODE = "worker"
TRIES = 5
"""Starts of one node before giving up (see ``RayCluster._start_node``)."""
NODE_ARGS = [
    "--block",  # one PID per node: SIGTERM to it stops the node's daemons
    "--node-ip-address=127.0.0.1",
    "--num-cpus=1",
    # Without these each node books 70 % of the machine's memory.
    "--memory=1500000000",
    "--object-store-memory=100000000",
    "--disable-usage-stats",
]


class RayClusterError(RuntimeError):
    pass


class RayCluster:
    """``with RayCluster() as c:`` brings up a head and a GPU worker; ``c.netns(argv)`` wraps a command
    so it runs beside them, and ``c.address`` is the GCS address to give it."""

    def __init__(self, ray_bin: Path | None = None, dashboard: bool = True) -> None:
        # Short: Ray puts unix sockets under its temp dir (107 characters at most), so /tmp itself
        # rather than the session's temp dir; named as amb's own, so `amb gc` knows it there.
        self.root = make_tempdir("ambray-", Path("/tmp"))
        self.real_bin = ray_bin or Path(sys.executable).parent
        self.bin = self._venv_view()
        self.dashboard = dashboard
        self.keeper: subprocess.Popen[bytes] | None = None
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.address = f"127.0.0.1:{HEAD_PORT}"
        self.dashboard_url = f"http://127.0.0.1:{DASHBOARD_PORT}"

    def _venv_view(self) -> Path:
        """A virtual environment that is the project's, but whose ``amb`` runs in this process's
        network namespace (see the module's docstring); returns its ``bin``."""
        real = self.real_bin.parent
        view = self.root / "venv"
        (view / "bin").mkdir(parents=True)
        shutil.copy(real / "pyvenv.cfg", view / "pyvenv.cfg")
        (view / "lib").symlink_to(real / "lib")
        (view / "bin" / "python").symlink_to(os.path.realpath(real / "bin" / "python"))
        here = f"/proc/{os.getpid()}/ns/net"
        amb = view / "bin" / "amb"
        amb.write_text(f'#!/bin/sh\nexec nsenter --net={here} -- {self.real_bin / "amb"} "$@"\n')
        amb.chmod(0o755)
        ray = view / "bin" / "ray"
        ray.write_text(f"#!{view / 'bin' / 'python'}\nfrom ray.scripts.scripts import main\nmain()\n")
        ray.chmod(0o755)
        return view / "bin"

    def netns(self, argv: list[str]) -> list[str]:
        """argv, run inside the cluster's network namespace."""
        assert self.keeper is not None
        return ["nsenter", f"--net=/proc/{self.keeper.pid}/ns/net", "--", *argv]

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RAY_ADDRESS": self.address,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TMPDIR": str(self.root),
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def start(self) -> RayCluster:
        if not (self.real_bin / "ray").exists():
            raise RayClusterError(
                f"no ray in {self.real_bin}: install the ray extra (pip install -e '.[ray]'; .ci/run does)"
            )
        try:
            # The keeper: a namespace with only lo, up; it sleeps until it is killed.
            self.keeper = subprocess.Popen(
                ["unshare", "--net", "sh", "-c", "ip link set lo up && exec sleep infinity"],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            deadline = time.monotonic() + 10
            while not self._lo_up():
                if self.keeper.poll() is not None or time.monotonic() > deadline:
                    raise RayClusterError("could not make a network namespace (unshare --net needs root)")
                time.sleep(0.05)
            head = [
                str(self.bin / "ray"),
                "start",
                "--head",
                f"--port={HEAD_PORT}",
                f"--temp-dir={self.root}",
                "--resources=" + json.dumps({"docker": 1}),
                "--num-gpus=0",
                *NODE_ARGS,
            ]
            if self.dashboard:
                # The Jobs API lives in the dashboard process; bound to loopback inside the namespace.
                head += [
                    "--include-dashboard=true",
                    "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={DASHBOARD_PORT}",
                ]
            else:
                head += ["--include-dashboard=false"]
            self._start_node("head", head)
            self._start_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def _lo_up(self) -> bool:
        assert self.keeper is not None
        try:
            out = subprocess.run(
                self.netns(["ip", "-o", "link", "show", "lo"]), capture_output=True, text=True, timeout=5
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
        return "UP" in out or "UNKNOWN" in out and "LOWER_UP" in out

    def _node(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")
        self.nodes[name] = subprocess.Popen(
            self.netns(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        log.close()

    def _wait_started(self, name: str, timeout: float) -> None:
        """Until ``ray start`` says its node runs (it says so once the node has registered with the
        cluster's control service); reading its output costs nothing, unlike asking the cluster."""
        deadline = time.monotonic() + timeout
        log = self.root / f"{name}.out"
        while time.monotonic() < deadline:
            if "Ray runtime started" in log.read_text(errors="replace"):
                return
            if self.nodes[name].poll() is not None:
                raise RayClusterError(f"ray node {name} exited: {self._tail(name)}")
            time.sleep(0.2)
        raise RayClusterError(f"ray node {name} not up after {timeout}s: {self._tail(name)}")

    def kill_worker(self) -> None:
        """The worker node dies: SIGKILL to every process of it (the ``ray start`` process and all its
        descendants: raylet, agents, workers and what they run), all at once."""
        p = self.nodes.pop(GPU_NODE)
        for pid in [p.pid, *descendants(p.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()

    def restart_worker(self) -> None:
        """The worker node comes back (a new node id), and has joined when this returns."""
        self._start_worker()

    def _start_worker(self) -> None:
        argv = [
            str(self.bin / "ray"),
            "start",
            f"--address={self.address}",
            "--resources=" + json.dumps({"docker": 1, "gpu_node": 1}),
            "--num-gpus=1",
            *NODE_ARGS,
        ]
        self._start_node(GPU_NODE, argv)

    def _start_node(self, name: str, argv: list[str]) -> None:
        """Start a node and wait until it runs. A node gives up if its
        raylet has not registered within 30 s (fixed in Ray), and the head if its client server
        has not seen the node: on a loaded machine that happens, and starting the node again is what
        an operator does (``TRIES`` times)."""
        for attempt in range(TRIES):
            self._node(name, argv)
            try:
                self._wait_started(name, timeout=240)
                return
            except RayClusterError:
                node = self.nodes.pop(name)
                if node.poll() is None or attempt == TRIES - 1:
                    self.nodes[name] = node
                    raise
                for pid in descendants(node.pid):  # what the failed start left
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def stop(self) -> None:
        """Each node by its PID (SIGTERM: `ray start --block` stops the node's daemons and exits), the
        worker first; SIGKILL to the process group of a node that does not stop; then the keeper."""
        for name in sorted(self.nodes, key=lambda n: n == "head"):
            p = self.nodes[name]
            tree = descendants(p.pid)
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for pid in tree:  # whatever of that node is left (none, when it stopped as it should)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.nodes.clear()
        if self.keeper is not None:
            self.keeper.kill()
            self.keeper.wait()
            self.keeper = None
        remove_tempdir(self.root)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _tail(self, name: str, n: int = 15) -> str:
        try:
            return "\n".join((self.root / f"{name}.out").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return f"(no {name}.out)"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(proc.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo += children.get(child, [])
    return out
