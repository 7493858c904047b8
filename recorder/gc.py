"""Remove what amb processes that are gone left behind: ``amb gc``, every amb-record at start, and a
recorder's watchdog (``recorder.watchdog``) for its own run (docs/recording.md).

Whatever amb makes in the temp dir is named in a lock file its owner holds while it lives
(``schemas.tempdirs``): a run's, whose docker resources and firewall rules carry the run id too
(docker labels ``org.amb.run`` and ``org.amb.lock``, the rules' comment ``amb-run:<id>``), or a
process's. What a free lock names is removed, then the lock; a held lock's never is. Entries no lock
names (made by anyone else) and docker resources with no ``org.amb.lock`` label are left alone.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recorder.host_firewall import FIREWALL_COMMENT
from recorder.runlock import owner_alive
from schemas.tempdirs import (
    ENTRY_PREFIX,
    LOCK_DIR_NAME,
    dead_lock,
    lock_dir,
    process_alive,
    remove_free_lock_file,
    remove_if_empty,
    remove_tree,
)


@dataclass(frozen=True)
class Removed:
    run_id: str
    """The run's id; empty for what a process made outside any run (a sweep execution's workspace)."""
    kind: str
    """container, network, firewall_rule, path or lock."""
    name: str


def collect(
    *,
    docker: bool | None = True,
    client: Any = None,
    everywhere: bool = True,
    locks: Collection[Path] | None = None,
) -> tuple[list[Removed], list[str]]:
    """Clean up after dead owners. Returns what was removed and problems met (not fatal).

    ``docker=None``: look at docker only if a dead run used it (so a local run does not need a daemon).
    Docker resources are looked at when their run lock lives in this process's lock directory, i.e.
    their recorder shared its temp dir; ``everywhere`` (``amb gc``) adds those whose lock file is gone
    (their temp dir went with a job). A recorder or a gc under another TMPDIR (a test harness, another
    sandbox on the same engine) then never removes leftovers that someone else is about to inspect.
    ``locks``: only these lock files and what they name (a watchdog's: its run's and its recorder's).
    """
    directory = lock_dir()
    if locks is None:
        candidates = sorted(directory.glob("*.lock")) if directory.is_dir() else []
    else:
        candidates = sorted(locks)
    dead = [(path, info) for path in candidates if (info := dead_lock(path)) is not None]
    runs = {str(info["run_id"]): {**info, "lock": path} for path, info in dead if info.get("run_id")}
    removed: list[Removed] = []
    problems: list[str] = []
    if docker is None:
        docker = any(info.get("backend") == "docker" for info in runs.values())
    if docker:
        scope = _Scope(directory, everywhere, None if locks is None else {str(p) for p in locks})
        try:
            _docker(client, runs, scope, removed, problems)
        except Exception as e:  # noqa: BLE001 - no daemon is not an error for gc: say it and go on
            problems.append(f"docker: {type(e).__name__}: {e}")
    removed += _firewall(runs)
    for path, info in dead:
        run_id = str(info.get("run_id") or "")
        own = _own_paths(path, info)
        for p in own:
            remove_tree(p)
            if os.path.lexists(p):
                problems.append(f"{p}: could not be removed (its owner's lock {path.name} is kept)")
            else:
                removed.append(Removed(run_id, "path", str(p)))
        if any(os.path.lexists(p) for p in own):
            continue  # still named, so that the next gc tries again
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(Removed(run_id, "lock", str(path)))
    if locks is None:
        removed += _loose_locks(directory)
    remove_if_empty(directory)
    return removed, problems


def _own_paths(lock: Path, info: dict) -> list[Path]:
    """The paths of a dead owner's lock file that really are amb's temp dirs of that owner.

    The lock directory is writable by everyone, so its files are not trusted: a path is removed
    only if it is a directory (not a link) directly in the temp dir the lock belongs to, named as
    amb names its entries, and owned by the lock file's owner, who must be us (or we are root).
    """
    try:
        owner = lock.lstat().st_uid
    except OSError:
        return []
    if owner != os.geteuid() and os.geteuid() != 0:
        return []
    tmp = lock.parent.parent
    out = []
    for p in map(Path, info.get("paths") or []):
        if p.parent != tmp or not p.name.startswith(ENTRY_PREFIX) or p.name == LOCK_DIR_NAME:
            continue
        try:
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == owner:
            out.append(p)
    return out


def _loose_locks(directory: Path) -> list[Removed]:
    """Lock files no owner holds: amb's lock files in the temp dir (``schemas.tempdirs.LockFile``),
    and owner locks a process was making when it died (``.<name>.<pid>.new``, before the rename)."""
    locks = sorted(directory.parent.glob(f"{ENTRY_PREFIX}-*.lock"))
    out = [Removed("", "lock", str(path)) for path in locks if remove_free_lock_file(path)]
    for path in sorted(directory.glob(".*.new")) if directory.is_dir() else []:
        pid = path.name.rsplit(".", 2)[-2]
        try:
            mine = path.lstat().st_uid == os.geteuid() or os.geteuid() == 0
        except OSError:
            continue
        if pid.isdigit() and mine and not process_alive(int(pid), None):
            path.unlink(missing_ok=True)
            out.append(Removed("", "lock", str(path)))
    return out


@dataclass(frozen=True)
class _Scope:
    directory: Path
    everywhere: bool
    locks: set[str] | None

    def covers(self, labels: dict[str, str]) -> bool:
        lock = labels["org.amb.lock"]
        if self.locks is not None:
            return lock in self.locks
        if Path(lock).parent == self.directory:
            return True
        return self.everywhere and not os.path.lexists(lock)


def _docker(
    client: Any, dead: dict[str, dict], scope: _Scope, removed: list[Removed], problems: list[str]
) -> None:
    """Removes the dead runs' containers and networks, appending to ``removed`` as it goes: a
    resource that fails to go is a problem and the others still go; one that vanished meanwhile
    (its own recorder or another gc removed it) is neither."""
    if client is None:
        import docker

        client = docker.from_env(timeout=30)
    from docker.errors import NotFound

    containers = client.containers.list(all=True, filters={"label": "org.amb.lock"}, ignore_removed=True)
    networks = []
    for network in client.networks.list(filters={"label": "org.amb.lock"}):
        with contextlib.suppress(NotFound):
            network.reload()
            networks.append(network)
    # Containers first: a network is removed once the dead run's containers on it are gone.
    found = [("container", c, c.labels or {}) for c in containers]
    found += [("network", n, n.attrs.get("Labels") or {}) for n in networks]
    for kind, thing, labels in found:
        run_id = labels.get("org.amb.run", "?")
        if not scope.covers(labels):
            continue
        if run_id in dead or not owner_alive(labels):
            dead.setdefault(run_id, {"paths": [], "lock": Path(labels["org.amb.lock"])})
            try:
                thing.remove(**({"force": True} if kind == "container" else {}))
            except NotFound:
                continue
            except Exception as e:  # noqa: BLE001 - one resource that resists stops no other
                problems.append(f"{kind} {thing.name}: could not be removed: {type(e).__name__}: {e}")
                continue
            removed.append(Removed(run_id, kind, thing.name))


def _firewall(dead: dict[str, dict]) -> list[Removed]:
    """The dead runs' host firewall rules (root with iptables only: nobody else can have made any)."""
    # Also where root's PATH has it: a job epilog runs with almost no environment.
    iptables = shutil.which(
        "iptables", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    )
    if os.geteuid() != 0 or iptables is None or not dead:
        return []
    listing = subprocess.run([iptables, "-w", "-S", "INPUT"], capture_output=True, text=True)
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
            proc = subprocess.run([iptables, "-w", "-D", *args[1:]], capture_output=True, text=True)
            if proc.returncode == 0:
                out.append(Removed(run_id, "firewall_rule", " ".join(args[1:])))
    return out
