"""The local backend: the agent is a child process of amb-record on this machine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from recorder.backend import AgentView, Exit, RunContext, seal_directory
from recorder.proxy.upstreams import KINDS
from schemas.errors import AmbError
from schemas.events import SubmissionSealed

if TYPE_CHECKING:
    from recorder.shim.receiver import ShimReceiver

SECRET_VARS = tuple(var for kind in KINDS.values() for var in kind.key_vars)
"""Real keys amb-record holds in custody, of every kind (a named upstream's key is replaced by its
placeholder in the agent's environment); the agent gets placeholders instead."""


def _die_with_parent() -> None:
    # If amb-record itself is killed (SIGKILL), the agent must not run on unrecorded: the kernel
    # sends it SIGKILL when its parent dies (Linux; a no-op elsewhere).
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LocalBackend:
    """Runs the command as a child in its own process group, the workspace as its cwd.

    With ``shim=True`` the command runs under the shim (``recorder/shim``), as in a container: every
    process and every workspace file change is recorded to the run's ``shim`` spool. The shim
    forwards signals to the agent and exits with its exit code. Without ``strace`` on the host the
    shim falls back to polling ``/proc`` (labelled ``proc-poll``; short processes may be missed).
    """

    name = "local"

    def __init__(self, shim: bool = False) -> None:
        self._ctx: RunContext | None = None
        self.shim = shim
        self._receiver: ShimReceiver | None = None
        self._sock_dir: str | None = None

    def proxy_listen_host(self) -> str:
        return "127.0.0.1"

    def prepare(self, ctx: RunContext) -> AgentView:
        self._ctx = ctx
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        data = None
        if ctx.data_dir is not None:
            # No isolation here: the agent is simply told where the public inputs are.
            public = Path(ctx.data_dir) / "public"
            data = str((public if public.is_dir() else Path(ctx.data_dir)).resolve())
        return AgentView(
            proxy_host="127.0.0.1",
            ca_bundle=str(ctx.ca_bundle) if ctx.ca_bundle else "",
            workspace=str(ctx.workspace),
            data=data,
        )

    def start(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        assert self._ctx is not None, "prepare() first"
        full = {k: v for k, v in os.environ.items() if k not in SECRET_VARS}
        full.update(env)
        if self.shim:
            argv = self._start_shim(argv, full)
        try:
            # A new session: signals we forward reach the agent's whole process group, and a
            # terminal's Ctrl-C reaches amb-record alone (which then forwards it, once).
            return subprocess.Popen(
                argv, cwd=self._ctx.workspace, env=full, start_new_session=True, preexec_fn=_die_with_parent
            )
        except FileNotFoundError:
            raise AmbError(f"cannot run {argv[0]!r}: command not found") from None
        except PermissionError:
            raise AmbError(f"cannot run {argv[0]!r}: permission denied") from None
        except OSError as e:
            raise AmbError(f"cannot run {argv[0]!r}: {e.strerror or e}") from None

    def _start_shim(self, argv: list[str], env: dict[str, str]) -> list[str]:
        from recorder.shim.local import REPO_ROOT, shim_argv
        from recorder.shim.receiver import ShimReceiver

        ctx = self._ctx
        assert ctx is not None
        self._sock_dir = tempfile.mkdtemp(prefix="amb-shim-sock-")
        receiver = ShimReceiver(ctx.store, ctx.run_id, Path(self._sock_dir), blobs=ctx.blobs).start()
        self._receiver = receiver
        # The shim imports only recorder.shim (stdlib + msgspec).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        return shim_argv(str(receiver.path), str(ctx.workspace), argv)

    def wait(self, handle: subprocess.Popen[bytes], timeout: float | None) -> Exit | None:
        try:
            rc = handle.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if rc < 0:
            return Exit(code=128 - rc, signal=-rc)
        return Exit(code=rc)

    def send_signal(self, handle: subprocess.Popen[bytes], sig: int) -> None:
        self._signal_group(handle, sig)

    def kill(self, handle: subprocess.Popen[bytes]) -> None:
        self._signal_group(handle, signal.SIGKILL)

    def pid(self, handle: subprocess.Popen[bytes]) -> int | None:
        return handle.pid

    def seal_submission(self, handle: subprocess.Popen[bytes]) -> SubmissionSealed:
        ctx = self._ctx
        assert ctx is not None
        # The workspace is the current directory: it may well hold the store (./amb-store by
        # default) or the temp dir with the per-run CA key. Neither is part of a submission.
        private = (ctx.store,) + ((ctx.ca_bundle.parent,) if ctx.ca_bundle else ())
        return seal_directory(ctx.workspace, ctx.blobs, exclude=private)

    def close(self, handle: subprocess.Popen[bytes] | None) -> None:
        if handle is not None:
            # The agent's background children may outlive it; the run ends with all of them (as a
            # container's does). The group outlives its leader while any member is alive.
            self._signal_group(handle, signal.SIGKILL)
            try:
                handle.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self._receiver is not None:
            self._receiver.close()  # drains what the shim sent, then closes the shim spool
            self._receiver = None
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None

    def tool_versions(self) -> dict[str, str]:
        return {}

    @staticmethod
    def _signal_group(handle: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(handle.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            try:
                handle.send_signal(sig)
            except ProcessLookupError:
                pass
