"""A real SLURM cluster on this one machine, for the scale-out tests and the benchmark.

One controller and two compute nodes (``slurmd -N n1`` / ``-N n2``, each on its own port), with a fake
GPU on n1: a gres whose ``File=`` is a character device made with mknod (SLURM drops a gres without a
file). No cgroups (``proctrack/linuxproc``, ``task/none``), no accounting database (``jobcomp/filetxt``
records each job's final state). ``amb gc`` is the job epilog, as docs/scale-out.md shows it for a real
cluster. Everything lives under one throwaway directory with its own munge key and socket; nothing
under /etc is read or written. SLURM cannot start in a loopback-only network
namespace (its name lookups fail there), so it runs in the host namespace and is configured to dial
127.0.0.1 only. Every daemon is started in its own session and stopped by its PID.

The Debian packages come from ``.ci/clusters.sh``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from schemas.tempdirs import make_tempdir, remove_tempdir

NODES = ("n1", "n2")
GPU_NODE = "n1"


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class ClusterError(RuntimeError):
    pass


class SlurmCluster:
    """``with SlurmCluster() as c:`` brings the cluster up; ``c.env`` points SLURM's clients at it."""

    def __init__(self, time_limit_min: int = 10) -> None:
        # In the temp dir, as amb's own (`amb gc` knows it). Short: munge's socket path must fit a
        # unix socket address.
        self.root = make_tempdir("ambslurm-")
        self.tmp = self.root / "tmp"
        """The jobs' temp dir (``env``), and so their lock dir: the epilog's ``amb gc`` is the only
        one to clean up after a killed job, not every recorder the other tests start meanwhile
        (each cleans up after the dead recorders of its own lock dir)."""
        self.conf = self.root / "slurm.conf"
        self.time_limit_min = time_limit_min
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ctld_port, *node_ports = free_ports(1 + len(NODES))
        self.node_ports = dict(zip(NODES, node_ports, strict=True))

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf), "TMPDIR": str(self.tmp)}

    @property
    def jobcomp(self) -> Path:
        return self.root / "log" / "jobcomp.txt"

    @property
    def epilog_log(self) -> Path:
        """What the job epilog said after each job: ``amb gc --json``'s answer, then
        ``epilog: job ID: amb gc exited STATUS``."""
        return self.root / "log" / "epilog.log"

    # ---- up -------------------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        for d in ("munge", "state", "log", "run", "dev", "spool"):
            (self.root / d).mkdir(mode=0o700)
        self.tmp.mkdir()
        self.tmp.chmod(0o1777)  # like the machine's
        for tool in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo"):
            if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
                raise ClusterError(f"{tool} is not installed (bash .ci/clusters.sh installs SLURM and munge)")
        try:
            self._munge()
            self._config()
            self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            for node in NODES:
                self._daemon(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
            self.wait_idle(NODES, timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def _munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.root / "munge"
        argv = [
            "munged",
            "--force",
            "--foreground",
            f"--key-file={key}",
            f"--socket={m / 'munge.sock'}",
            f"--pid-file={m / 'munged.pid'}",
            f"--log-file={m / 'munged.log'}",
            f"--seed-file={m / 'munged.seed'}",
        ]
        self._daemon("munged", argv)
        deadline = time.monotonic() + 10
        while not (m / "munge.sock").exists():
            if time.monotonic() > deadline or self.procs["munged"].poll() is not None:
                raise ClusterError(f"munged did not start: {self._tail(m / 'munged.log')}")
            time.sleep(0.05)

    def _config(self) -> None:
        r = self.root
        (r / "dev" / "nvidia0").unlink(missing_ok=True)
        # The numbers of /dev/null: a character device SLURM accepts as the GPU's File=, which no job uses.
        os.mknod(r / "dev" / "nvidia0", 0o600 | 0o020000, os.makedev(1, 3))
        nodes = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.node_ports[n]} CPUs=1 "
            f"RealMemory=2000{' Gres=gpu:1' if n == GPU_NODE else ''}"
            for n in NODES
        )
        self.conf.write_text(
            f"""ClusterName=ambtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.sock
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={r}/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
GresTypes=gpu
MinJobAge=300
SlurmdTimeout=5
MessageTimeout=5
KillWait=30
Epilog={r}/epilog.sh
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime={self.time_limit_min} State=UP
""",
            encoding="utf-8",
        )
        # `amb gc` as the job epilog, as docs/scale-out.md shows it, in the temp dir the jobs use (they
        # inherit this process's environment; the epilog gets almost none).
        epilog = r / "epilog.sh"
        amb = Path(sys.executable).parent / "amb"
        epilog.write_text(
            f"#!/bin/sh\nTMPDIR={self.tmp} {amb} gc --json >>{self.epilog_log} 2>&1\nstatus=$?\n"
            f'echo "epilog: job $SLURM_JOB_ID: amb gc exited $status" >>{self.epilog_log}\nexit $status\n',
            encoding="utf-8",
        )
        epilog.chmod(0o755)
        (r / "gres.conf").write_text(f"NodeName={GPU_NODE} Name=gpu File={r}/dev/nvidia0\n", encoding="utf-8")

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"},
            start_new_session=True,
        )
        log.close()

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, nodes: tuple[str, ...] | list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            # "comp": a node back from the dead still finishing the jobs it lost; it answers.
            if all(states.get(n, "") in ("idle", "mix", "alloc", "comp") for n in nodes):
                return
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise ClusterError(f"{name} exited: {self._tail(self.root / 'log' / f'{name}.out')}")
            time.sleep(0.2)
        raise ClusterError(
            f"nodes not idle after {timeout}s: {states}; {self._tail(self.root / 'log' / 'slurmctld.log')}"
        )

    # ---- during the tests ------------------------------------------------------------------------

    def run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=30
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc

    def kill_node(self, node: str) -> None:
        """The node dies: ``kill -9`` its slurmd and every job it was running (the job step daemon and
        the job's processes, which SLURM keeps in one session per job)."""
        p = self.procs.pop(f"slurmd-{node}")
        p.kill()
        p.wait()
        _kill_sessions(self._job_sessions(node))

    def restart_node(self, node: str) -> None:
        self._daemon(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])

    # ---- down ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel every job, stop every daemon by its PID (slurmds first, munged last), kill what is
        left of the jobs (a slurmd's jobs outlive it by design), then drop the directory."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--quiet", "--user=root"], check=False)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self._job_sessions():
                time.sleep(0.2)
        order = sorted(self.procs, key=lambda n: (n == "munged", n == "slurmctld", n))
        for name in order:
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
        for name in order:
            p = self.procs[name]
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        _kill_sessions(self._job_sessions())
        remove_tempdir(self.root)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _job_sessions(self, node: str | None = None) -> set[int]:
        """Session ids of the jobs this cluster runs (on ``node``, or on any). A job's processes carry
        ``SLURM_CONF`` (this cluster's) and ``SLURMD_NODENAME`` in their environment; SLURM starts each
        job in a session of its own, which its slurmstepd shares."""
        conf = f"SLURM_CONF={self.conf}".encode()
        want = f"SLURMD_NODENAME={node}".encode() if node else b"SLURMD_NODENAME="
        sids = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
                if conf in env and any(e.startswith(want) and (node is None or e == want) for e in env):
                    sids.add(os.getsid(int(proc.name)))
            except (OSError, ProcessLookupError):
                continue
        return sids

    @staticmethod
    def _tail(path: Path, n: int = 15) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return f"(no {path.name})"


def _kill_sessions(sids: set[int]) -> None:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getsid(int(proc.name)) in sids:
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
