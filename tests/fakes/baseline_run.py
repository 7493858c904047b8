"""A run as the demo records one: ``amb-record`` (real proxy, local backend) running ``amb-agent``
against the offline baseline server, on a task's synthetic twin, in a workspace holding the tier's
brief. The agent, viewer, replay and ATIF tests record their runs through this one command line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tasks.registry import brief

BIN = Path(sys.executable).parent


def record_baseline_run(
    store: Path,
    server_url: str,
    twin: Path,
    ws: Path,
    *,
    task: str,
    tier: str,
    run_id: str,
    model: str = "baseline",
    record_args: Sequence[str] = (),
    agent_args: Sequence[str] = (),
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``amb-record [record_args] -- amb-agent --model MODEL [agent_args]`` in ``ws`` to its end.
    ``model`` names the baseline's policy (``baseline+crash-mid-batch`` is the demo's flawed agent)."""
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "tier_prompt.txt").write_text(brief(task, tier))
    return subprocess.run(
        [
            str(BIN / "amb-record"),
            "--store",
            str(store),
            "--task",
            task,
            "--tier",
            tier,
            "--data",
            str(twin),
            "--run-id",
            run_id,
            "--upstream",
            f"openai={server_url}",
            *record_args,
            "--",
            str(BIN / "amb-agent"),
            "--model",
            model,
            "--task-dir",
            ".",
            "--data",
            str(twin / "public"),
            *agent_args,
        ],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
