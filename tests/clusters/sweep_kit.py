"""The sweep every engine test runs, and how two stores of it are compared, cell for cell.

The scripted baseline (the fastest agent there is: no model, an offline scripted server) as two agents
(a clean one and one whose outputs are misnamed) x 2 tasks x the tiers of ``tests.soak.SWEEP_TIERS``
(the standard brief; both tiers under ``AMB_SOAK=1``), with the docker backend; one cell needs a
GPU. ``gpu_mode = "env"``: the allocated GPU ids reach the container as ``NVIDIA_VISIBLE_DEVICES``
(what NVIDIA's runtime reads), since this machine has no GPU driver.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replay.store import Store
from tests.fakes.sweep_agent import TWO_AGENTS
from tests.soak import SWEEP_TIERS

BIN = Path(sys.executable).parent
GPU_CELL = ("clean", "bccd-det", "standard")
TASKS = ("bccd-det", "vqa-rad")


def sweep_file(name: str, *, extra: str = "") -> str:
    agent, task, tier = GPU_CELL
    return f"""
name = "{name}"
tasks = {json.dumps(list(TASKS))}
tiers = {json.dumps(list(SWEEP_TIERS))}
repeats = 1
concurrency = 2
time_limit_s = 60
max_attempts = 2
backend = "docker"
cases = 1
seed = 5
baseline = true
gpu_mode = "env"
cpus = 1
memory = "1g"
{TWO_AGENTS}
[[resources]]
agent = "{agent}"
task = "{task}"
tier = "{tier}"
gpus = 1
{extra}
"""


def cells(name: str) -> list[str]:
    return [f"{name}-{a}-{t}-{tier}-r1" for a in ("clean", "misnamed") for t in TASKS for tier in SWEEP_TIERS]


def gpu_cell(name: str) -> str:
    agent, task, tier = GPU_CELL
    return f"{name}-{agent}-{task}-{tier}-r1"


def sweep_argv(sweepfile: Path, store: Path, work: Path, executor: str, *extra: str) -> list[str]:
    return [
        str(BIN / "amb"),
        "sweep",
        "run",
        "--store",
        str(store),
        "--work",
        str(work),
        "--executor",
        executor,
        str(sweepfile),
        *extra,
    ]


def prepare(tmp: Path, name: str, executor: str, *extra: str) -> tuple[Path, Path, list[str]]:
    """Write the sweep file under ``tmp``; returns (store, work dir, the sweep's command line)."""
    (tmp / "sweep.toml").write_text(sweep_file(name), encoding="utf-8")
    store, work = tmp / "store", tmp / "work"
    return store, work, sweep_argv(tmp / "sweep.toml", store, work, executor, *extra)


def assert_equals_local(
    store: Path, work: Path, name: str, local: dict[str, dict[str, Any]], client: Any
) -> None:
    """The engine's store against the local sweep's: no cell lost, each equal to the local one's; no
    mixed attempt (every stored run is one shard's, whole, and its chain verifies); no container left."""
    got = by_cell(store, name, work)
    assert sorted(got) == sorted(cells(name))
    mine, theirs = comparable(got), comparable(local)
    assert mine == theirs, differences(mine, theirs) + f"\nthe store's runs per cell: {runs_per_cell(got)}"
    check = subprocess.run(
        [str(BIN / "amb"), "verify", "--store", str(store)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert not running_containers(client, work)


def run_sweep(
    tmp: Path, name: str, executor: str, env: Mapping[str, str] | None = None, wrap: list[str] | None = None
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """Run the sweep to the end with one executor; returns (store, work dir, the finished process)."""
    tmp.mkdir(parents=True, exist_ok=True)
    store, work, argv = prepare(tmp, name, executor)
    proc = subprocess.run(
        (wrap or []) + argv, capture_output=True, text=True, timeout=600, env=dict(env) if env else None
    )
    return store, work, proc


def by_cell(store: Path, name: str, work: Path) -> dict[str, dict[str, Any]]:
    """Per cell (the run id without its attempt suffix): status, scores and event counts per kind of
    the run the sweep took for it (``chosen``: the one it scored); also every run the store holds for
    the cell."""
    with Store.open(store, read_only=True) as st:
        runs = st.con.execute(
            "SELECT run_id, status FROM runs WHERE labels->>'sweep' = ? ORDER BY run_id", [name]
        ).fetchall()
        scores = {
            r: (s1, s2, s3, s4, s5, task, sorted(json.loads(c) if isinstance(c, str) else (c or [])))
            for r, s1, s2, s3, s4, s5, task, c in st.con.execute(
                "SELECT run_id, s1, s2, s3, s4, s5, task_score, codes FROM scores_current"
            ).fetchall()
        }
        kinds: dict[str, dict[str, int]] = {}
        for r, kind, n in st.con.execute("SELECT run_id, kind, count(*) FROM events GROUP BY ALL").fetchall():
            kinds.setdefault(r, {})[kind] = n
    out: dict[str, dict[str, Any]] = {}
    for run_id, status in runs:
        cell = run_id.split(".a")[0]
        entry = out.setdefault(cell, {"runs": []})
        entry["runs"].append(run_id)
        if run_id == chosen(work, cell):
            entry.update(status=status, scores=scores.get(run_id), kinds=kinds.get(run_id, {}))
    return out


TIMING_KINDS = ("file.written", "file.deleted")
"""Kinds whose count is not a function of the run alone. The shim coalesces quick successive writes
of one file, so two runs of one cell have been seen to differ by one ``file.written``; and a workspace
file made and deleted before the shim could read it is reported neither written nor deleted
(``recorder/shim/watch.py``: the workspace's final state is what counts), which is what becomes of
the agent's short-lived ``.amb_exec_*`` scripts when a loaded machine delays the watcher (the likely
cause of a CI run where both engines' sweeps differed from the local one, before the differences
were printed). They must be present on both sides; their counts are not compared."""


def comparable(cells_: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What must be equal across executors, per cell: status, scores and event counts per kind (in
    JSON's terms, so that cells read back from JSON compare equal to cells just read from a store)."""
    out = {}
    for c, v in cells_.items():
        kinds = dict(v.get("kinds") or {})
        for k in TIMING_KINDS:
            kinds[k] = bool(kinds.get(k))
        out[c] = [v.get("status"), v.get("scores"), kinds]
    return json.loads(json.dumps(out))


def differences(mine: dict[str, Any], local: dict[str, Any]) -> str:
    """The cells that differ, each as this engine's value beside the local sweep's (this module is not
    a test module, so pytest does not rewrite its asserts into a diff)."""
    lines = []
    for cell in sorted(set(mine) | set(local)):
        if mine.get(cell) != local.get(cell):
            lines += [cell, f"  engine: {mine.get(cell)}", f"  local:  {local.get(cell)}"]
    return "\n".join(lines)


def runs_per_cell(cells_: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {c: v["runs"] for c, v in cells_.items()}


def chosen(work: Path, cell: str) -> str:
    """The run id the shard root took for a cell (its first completed attempt); "" if none."""
    try:
        return (work / "cells" / cell).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return ""


class ContainerWatch:
    """Every agent container a sweep starts, seen from Docker's event stream: its labels and the
    ``NVIDIA_VISIBLE_DEVICES`` it was given (read the moment it starts)."""

    def __init__(self, client: Any, sweep_root: Path) -> None:
        self.client = client
        self.root = str(sweep_root)
        self.seen: dict[str, dict[str, Any]] = {}
        self._events = client.events(decode=True, filters={"type": "container", "event": "start"})
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            for ev in self._events:
                attrs = ev.get("Actor", {}).get("Attributes", {})
                if attrs.get("org.amb.sweep_root") != self.root:
                    continue
                try:
                    env = self.client.containers.get(ev["id"]).attrs["Config"]["Env"] or []
                except Exception:  # noqa: BLE001 - gone already: recorded without its env
                    env = None
                self.seen[attrs.get("org.amb.run", ev["id"])] = {"labels": attrs, "env": env}
        except Exception:  # noqa: BLE001 - the stream is closed by stop()
            return

    def stop(self) -> None:
        self._events.close()

    def gpu_env(self, run_id: str) -> str | None:
        env = self.seen.get(run_id, {}).get("env") or []
        for item in env:
            if item.startswith("NVIDIA_VISIBLE_DEVICES="):
                return str(item.split("=", 1)[1])
        return None


def running_containers(client: Any, sweep_root: Path) -> list[str]:
    # ignore_removed: the list is inspected container by container, and one that stops and is removed
    # in between (what cancel makes happen) is no longer running, not an error.
    found = client.containers.list(filters={"label": f"org.amb.sweep_root={sweep_root}"}, ignore_removed=True)
    return [c.name for c in found]
