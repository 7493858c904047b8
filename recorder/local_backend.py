"""The local backend: the agent is a child process of amb-record on this machine."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from recorder.backend import AgentView, Exit, RunContext, seal_directory
from recorder.isolation import DEFAULT_MODE, MODES, Namespaced, block_stop_signals, decide
from recorder.proxy.upstreams import KINDS
from schemas.errors import AmbError, UsageError
from schemas.events import Isolation, SubmissionSealed
from schemas.tempdirs import make_tempdir, remove_tempdir

if TYPE_CHECKING:
    from recorder.shim.receiver import ShimReceiver

SECRET_VARS = tuple(var for kind in KINDS.values() for var in kind.key_vars)
"""Real keys amb-record holds in custody, of every kind (a named upstream's key is replaced by its
placeholder in the agent's environment); the agent gets placeholders instead."""


def _die_with_parent() -> None:
    # If amb-record itself is killed (SIGKILL), the agent must not run on unrecorded: the kernel
    # sends it SIGKILL when its parent dies (Linux; a no-op elsewhere).
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _die_with_parent_isolated() -> None:
    _die_with_parent()
    block_stop_signals()


def _cannot_run(name: str, code: int | None, detail: str | None = None) -> AmbError:
    what = {errno.ENOENT: "command not found", errno.EACCES: "permission denied"}.get(code or 0)
    return AmbError(f"cannot run {name!r}: {what or detail or os.strerror(code or 0)}")


class LocalBackend:
    """Runs the command as a child in its own process group, the workspace as its cwd: in namespaces
    of its own as ``isolation`` says (``recorder.isolation``; what the run had is ``isolation`` once
    prepared), and with ``shim=True`` under the shim, as in a container (``recorder/shim``)."""

    name = "local"

    def __init__(self, shim: bool = False, isolation: str = DEFAULT_MODE) -> None:
        if isolation not in MODES:
            raise UsageError(f"isolation {isolation!r}: expected one of {', '.join(MODES)}")
        self._ctx: RunContext | None = None
        self.shim = shim
        self.isolation_mode = isolation
        self.isolation: Isolation | None = None
        self._namespaced: Namespaced | None = None
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
        self.isolation = decide(self.isolation_mode)
        return AgentView(
            proxy_host="127.0.0.1",
            ca_bundle=str(ctx.ca_bundle) if ctx.ca_bundle else "",
            workspace=str(ctx.workspace),
            isolation=self.isolation,
            data=data,
        )

    def start(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        assert self._ctx is not None, "prepare() first"
        full = {k: v for k, v in os.environ.items() if k not in SECRET_VARS}
        full.update(env)
        if self.shim:
            argv = self._start_shim(argv, full)
        isolated = self.isolation is not None and self.isolation.kind == "namespaces"
        ns = self._namespaced = Namespaced() if isolated else None
        command = ns.argv(argv) if ns is not None else argv
        try:
            # A new session: signals we forward reach the agent's whole process group, and a
            # terminal's Ctrl-C reaches amb-record alone (which then forwards it, once).
            handle = subprocess.Popen(
                command,
                cwd=self._ctx.workspace,
                env=full,
                start_new_session=True,
                preexec_fn=_die_with_parent if ns is None else _die_with_parent_isolated,
                pass_fds=() if ns is None else (ns.write_fd,),
            )
        except OSError as e:
            raise _cannot_run(command[0], e.errno, e.strerror) from None
        if ns is not None:
            failed = ns.started(handle)  # the init has started the agent, or says why it could not
            if failed is not None:
                raise _cannot_run(argv[0], failed)
        return handle

    def _start_shim(self, argv: list[str], env: dict[str, str]) -> list[str]:
        from recorder.shim.local import importable, shim_argv
        from recorder.shim.receiver import ShimReceiver

        ctx = self._ctx
        assert ctx is not None
        self._sock_dir = str(make_tempdir("amb-shim-sock-"))
        receiver = ShimReceiver(ctx.store, ctx.run_id, Path(self._sock_dir), blobs=ctx.blobs).start()
        self._receiver = receiver
        importable(env)
        return shim_argv(str(receiver.path), str(ctx.workspace), argv)

    def wait(self, handle: subprocess.Popen[bytes], timeout: float | None) -> Exit | None:
        try:
            rc = handle.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        # Isolated, the agent's end comes from its init: unshare's own exit code cannot tell a
        # signal from an exit code of 128+N. Nothing reported: the init died too (a SIGKILL to the
        # group), and unshare dies of the init's signal.
        ended = self._namespaced.end() if self._namespaced is not None else None
        # With --shim, the shim is the agent's parent, in its process group: an agent that kills
        # the group (or its parent) kills the shim too, and what it did afterwards goes unseen.
        lost = self._receiver.lost() if self._receiver is not None else None
        if ended is not None:
            return Exit(code=ended[0], signal=ended[1], lost=lost)
        if rc < 0:
            return Exit(code=128 - rc, signal=-rc, lost=lost)
        return Exit(code=rc, lost=lost)

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
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.wait(5)
        if self._namespaced is not None:
            self._namespaced.close()
            self._namespaced = None
        if self._receiver is not None:
            self._receiver.close()  # drains what the shim sent, then closes the shim spool
            self._receiver = None
        if self._sock_dir is not None:
            remove_tempdir(Path(self._sock_dir))
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
            with contextlib.suppress(ProcessLookupError):
                handle.send_signal(sig)
