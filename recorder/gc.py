"""Remove what runs whose recorder is gone left behind (``amb gc``, and every amb-record at start).

A recorder killed with ``kill -9`` cannot clean up: its container, its per-run network, its host
firewall rules and its temp dirs (workspace, CA key) stay. Each carries the run id (docker labels
``org.amb.run``, the firewall rules' comment ``amb-run:<id>``, the paths listed in the run's lock
file), and ``recorder.runlock`` says whether the recorder is alive. Only what belongs to a dead
recorder is removed; anything made before run locks existed (no ``org.amb.lock`` label) is left.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recorder.runlock import dead_lock, lock_dir, owner_alive

FIREWALL_COMMENT = "amb-run:"


@dataclass(frozen=True)
class Removed:
    run_id: str
    kind: str
    """container, network, firewall_rule, path or lock."""
    name: str


def collect(
    *, docker: bool | None = True, client: Any = None, everywhere: bool = True
) -> tuple[list[Removed], list[str]]:
    """Clean up after dead recorders. Returns what was removed and problems met (not fatal).

    ``docker=None``: look at docker only if a dead run used it (so a local run does not need a daemon).
    ``everywhere=False`` (amb-record at start): only docker resources whose run lock lives in this
    process's lock directory, i.e. of recorders that shared its temp dir; ``amb gc`` looks at every
    resource on the engine. A recorder starting under another TMPDIR (a test harness, another
    sandbox on the same engine) then never removes leftovers that someone else is about to inspect.
    """
    removed: list[Removed] = []
    problems: list[str] = []
    dead: dict[str, dict] = {}
    directory = lock_dir()
    locks = sorted(directory.glob("*.lock")) if directory.is_dir() else []
    for path in locks:
        info = dead_lock(path)
        if info is not None:
            dead[str(info["run_id"])] = {**info, "lock": path}
    if docker is None:
        docker = any(info.get("backend") == "docker" for info in dead.values())
    if docker:
        try:
            removed += _docker(client, dead, None if everywhere else directory)
        except Exception as e:  # noqa: BLE001 - no daemon is not an error for gc: say it and go on
            problems.append(f"docker: {type(e).__name__}: {e}")
    removed += _firewall(dead)
    for run_id, info in dead.items():
        for p in _own_paths(run_id, info):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(Removed(run_id, "path", str(p)))
        try:
            info["lock"].unlink()
            removed.append(Removed(run_id, "lock", str(info["lock"])))
        except FileNotFoundError:
            pass
    return removed, problems


def _own_paths(run_id: str, info: dict) -> list[Path]:
    """The paths of a dead run's lock file that really are that run's temp dirs.

    The lock directory is writable by everyone, so its files are not trusted: a path is removed
    only if it is a directory (not a link) directly in the temp dir, named after the run as
    amb-record names it, and owned by the lock file's owner, who must be us (or we are root).
    """
    lock: Path = info["lock"]
    try:
        owner = lock.lstat().st_uid
    except OSError:
        return []
    if owner != os.geteuid() and os.geteuid() != 0:
        return []
    tmp = Path(tempfile.gettempdir())
    out = []
    for p in map(Path, info.get("paths", [])):
        if p.parent != tmp or not p.name.startswith((f"amb-{run_id}-", f"amb-docker-{run_id}-")):
            continue
        try:
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == owner:
            out.append(p)
    return out


def _in_scope(labels: dict[str, str], directory: Path | None) -> bool:
    return directory is None or Path(labels["org.amb.lock"]).parent == directory


def _docker(client: Any, dead: dict[str, dict], directory: Path | None) -> list[Removed]:
    if client is None:
        import docker

        client = docker.from_env(timeout=30)
    out: list[Removed] = []
    for container in client.containers.list(all=True, filters={"label": "org.amb.lock"}):
        labels = container.labels or {}
        run_id = labels.get("org.amb.run", "?")
        if not _in_scope(labels, directory):
            continue
        if run_id in dead or not owner_alive(labels):
            dead.setdefault(run_id, {"paths": [], "lock": Path(labels["org.amb.lock"])})
            container.remove(force=True)
            out.append(Removed(run_id, "container", container.name))
    for network in client.networks.list(filters={"label": "org.amb.lock"}):
        network.reload()
        labels = network.attrs.get("Labels") or {}
        run_id = labels.get("org.amb.run", "?")
        if not _in_scope(labels, directory):
            continue
        if run_id in dead or not owner_alive(labels):
            dead.setdefault(run_id, {"paths": [], "lock": Path(labels["org.amb.lock"])})
            network.remove()  # its containers (the dead run's) were removed above
            out.append(Removed(run_id, "network", network.name))
    return out


def _firewall(dead: dict[str, dict]) -> list[Removed]:
    """The dead runs' host firewall rules (root with iptables only: nobody else can have made any)."""
    if os.geteuid() != 0 or shutil.which("iptables") is None or not dead:
        return []
    listing = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True)
    if listing.returncode != 0:
        return []
    out = []
    for line in listing.stdout.splitlines():
        args = shlex.split(line)
        if not args or args[0] != "-A" or "--comment" not in args:
            continue
        comment = args[args.index("--comment") + 1]
        run_id = comment.removeprefix(FIREWALL_COMMENT)
        if comment.startswith(FIREWALL_COMMENT) and run_id in dead:
            proc = subprocess.run(["iptables", "-w", "-D", *args[1:]], capture_output=True, text=True)
            if proc.returncode == 0:
                out.append(Removed(run_id, "firewall_rule", " ".join(args[1:])))
    return out
