"""``amb-record`` as the CLI tests run it: against the fake provider (OpenAI and Anthropic on one
loopback URL), with the real keys in its environment and none in the agent's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.fakes.harness import REAL_KEYS

BIN = Path(sys.executable).parent


def amb_record(
    store: Path,
    fake_url: str,
    argv: list[str],
    *,
    cwd: Path,
    extra: Sequence[str] = (),
    env: dict | None = None,
    timeout: float = 120,
    **popen,
) -> subprocess.CompletedProcess:
    """``amb-record [extra] -- argv`` in ``cwd`` to its end, its output captured."""
    full_env = {**os.environ, **REAL_KEYS, **(env or {})}
    cmd = [
        str(BIN / "amb-record"),
        "--store",
        str(store),
        "--upstream",
        f"openai={fake_url}",
        "--upstream",
        f"anthropic={fake_url}",
        *extra,
        "--",
        *argv,
    ]
    return subprocess.run(
        cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, **popen
    )
