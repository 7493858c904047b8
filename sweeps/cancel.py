"""``amb sweep cancel DIR``: stop a sweep from any machine that sees its shared directory.

The executor that runs it is rebuilt from its saved state and cancelled (SIGTERM to the driver and to
every ``amb sweep exec``, ``scancel``, ``ray.cancel``): each exec stops its own container. Then, on
this machine's Docker engine, any container of the sweep still there after ``wait_s`` is removed.
"""

from __future__ import annotations

import time
from pathlib import Path

from sweeps.exec import SWEEP_ROOT_LABEL
from sweeps.executor import attach
from sweeps.shard import Layout


def containers(root: Path) -> list:
    """This engine's running containers of the sweep at ``root`` (empty when no engine answers)."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        return list(
            client.containers.list(filters={"label": f"{SWEEP_ROOT_LABEL}={root}"}, ignore_removed=True)
        )
    except Exception:  # no engine here: nothing of the sweep runs in it
        return []


def cancel(root: Path, *, wait_s: float = 10.0) -> list[str]:
    """Cancel the sweep at ``root``; returns what was done, one line each."""
    root = Path(root).resolve()
    said: list[str] = []
    ex = attach(Layout(root))
    if ex is None:
        said.append(f"{root}: no executor state (nothing was submitted from this directory)")
    else:
        ex.cancel()
        said.append(f"{ex.name} executor: cancelled")
        ex.close()
    deadline = time.monotonic() + wait_s
    left = containers(root)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = containers(root)
    for c in left:
        try:
            c.remove(force=True)
            said.append(f"container {c.name} was still running after {wait_s:g}s: removed")
        except Exception as e:  # it may have gone meanwhile; say what happened
            said.append(f"container {c.name}: could not remove: {e}")
    if not left:
        said.append("no container of the sweep is running on this machine")
    return said
