"""The shim around a local run: the same shim, on a working directory of this machine.

``run_local`` starts a receiver on a private unix socket, runs ``python -m recorder.shim run``
around the command, and returns once the shim's stream has been received and made durable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from recorder.shim.receiver import ShimReceiver
from recorder.shim.shim import DEFAULT_CAP
from schemas.blobstore import BlobStore
from schemas.tempdirs import tempdir

REPO_ROOT = Path(__file__).resolve().parents[2]


def importable(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this tree on ``PYTHONPATH``: the shim imports only recorder.shim (stdlib + msgspec)."""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


@dataclass(frozen=True)
class LocalResult:
    exit_code: int
    shim_counts: dict[str, int]
    events: dict[str, int]
    error: str | None


def shim_argv(
    socket_path: str,
    workspace: str,
    argv: list[str],
    *,
    entry: Sequence[str] = (sys.executable, "-P", "-m", "recorder.shim"),
    content_cap: int = DEFAULT_CAP,
    watched: Sequence[str] = (),
    outside: Sequence[str] = (),
    tracer: str = "auto",
    private_dir: str | None = None,
    flags: Sequence[str] = (),
) -> list[str]:
    """The command that runs ``argv`` under the shim (``entry`` starts its ``__main__``). It starts
    in the agent's workspace: ``-P`` keeps that folder off the import path, so a ``recorder``
    package there (left by an agent in a workspace used again) is never the shim."""
    cmd = [*entry, "run", "--socket", socket_path, "--workspace", workspace]
    cmd += ["--content-cap", str(content_cap), "--tracer", tracer, *flags]
    for w in watched:
        cmd += ["--watch", w]
    for d in outside:
        cmd += ["--outside", d]
    if private_dir is not None:
        cmd += ["--private-dir", private_dir]
    return cmd + ["--", *argv]


def run_local(
    store: Path,
    run_id: str,
    workspace: Path,
    argv: list[str],
    *,
    content_cap: int = DEFAULT_CAP,
    watched: Sequence[str] = (),
    outside: Sequence[str] = (),
    tracer: str = "auto",
    timeout: float | None = None,
    private_dir: str | None = None,
) -> LocalResult:
    workspace.mkdir(parents=True, exist_ok=True)
    with tempdir("amb-shim-sock-") as sock_dir:
        receiver = ShimReceiver(
            store, run_id, sock_dir, blobs=BlobStore(Path(store) / "blobs"), content_cap=content_cap
        ).start()
        try:
            proc = subprocess.run(
                shim_argv(
                    str(receiver.path),
                    str(workspace),
                    argv,
                    content_cap=content_cap,
                    watched=watched,
                    outside=outside,
                    tracer=tracer,
                    private_dir=private_dir,
                ),
                env=importable(dict(os.environ)),
                timeout=timeout,
            )
            code = proc.returncode
        finally:
            receiver.close()
        bye = receiver.bye
        return LocalResult(code, dict(bye.counts) if bye else {}, dict(receiver.counts), receiver.error)
