"""The local agent in user, PID and mount namespaces of its own: it sees its own processes only, not
the other processes of its user, whose environments may hold the real key (docs/recording.md).

``unshare`` (util-linux) starts the agent with the user mapped to itself (no capabilities), a new PID
namespace and a fresh ``/proc``; the namespace's PID 1 is ``recorder/nsinit.py``, which reports the
agent's end on a pipe. ``unshare --kill-child`` and amb-record's parent-death signal take the whole
namespace down with a SIGKILLed amb-record. Where the kernel refuses, ``probe`` says why in one line.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from schemas.errors import AmbError
from schemas.events import Isolation
from schemas.fdwait import readable

MODES = ("required", "best-effort", "off")
"""``--isolation``: refuse to run without namespaces; use them where possible (the default); never."""

DEFAULT_MODE = "best-effort"

INIT = Path(__file__).with_name("nsinit.py")

PROBE_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
"""How long the namespace's init may take to start the agent (a Python start on a loaded machine)."""

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def unshare_argv(unshare: str) -> list[str]:
    """``unshare`` with amb's namespaces, up to the command (which follows)."""
    return [
        unshare,
        f"--map-user={os.geteuid()}",
        f"--map-group={os.getegid()}",
        "--pid",
        "--mount-proc",  # a new mount namespace, private, with /proc of the new PID namespace
        "--kill-child",  # the init (and so the namespace) dies with unshare
        "--",
    ]


def probe() -> str | None:
    """None when this user can start a command in namespaces of its own here; else why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "`unshare` (util-linux) is not on PATH"
    try:
        proc = subprocess.run(
            [*unshare_argv(unshare), sys.executable, "-I", "-S", "-c", ""],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"`unshare` did not finish within {PROBE_TIMEOUT_S:g} s"
    except OSError as e:
        return f"cannot run {unshare}: {e.strerror or e}"
    if proc.returncode != 0:
        said = proc.stderr.strip().splitlines()
        return said[-1] if said else f"`unshare` exited with {proc.returncode}"
    return None


def decide(mode: str) -> Isolation:
    """The isolation a run gets under ``--isolation mode``; ``AmbError`` if ``required`` cannot be had."""
    if mode == "off":
        return Isolation(kind="none", requested=mode, reason="--isolation off")
    why = probe()
    if why is None:
        return Isolation(kind="namespaces", requested=mode)
    if mode == "required":
        raise AmbError(
            f"--isolation required: this system cannot hide the other processes from a local agent "
            f"({why}); `amb doctor` says what to change, or use --backend docker"
        )
    return Isolation(kind="none", requested=mode, reason=why)


def unprotected_warning(isolation: Isolation) -> str | None:
    """The line amb-record prints at start when the agent will see the user's other processes
    although nobody asked for that (``--isolation off`` says nothing: the user chose it)."""
    if isolation.kind != "none" or isolation.requested == "off":
        return None
    return (
        f"the local agent is not isolated ({isolation.reason}): it sees every process of your user "
        "and can read their environments and memory; `amb doctor` says what to change "
        "(--isolation required refuses to run so)"
    )


def block_stop_signals() -> None:
    """In ``unshare``'s ``preexec_fn``: a stop signal amb-record forwards to the agent's process group
    must not kill ``unshare``, which stays to report the init's end; the init unblocks them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


class Namespaced:
    """The status pipe of one agent started under ``unshare`` and ``nsinit``."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self._pending = b""
        self.ended: str | None = None
        """``exit CODE`` or ``signal N``, once the init reported it."""

    def argv(self, command: list[str]) -> list[str]:
        """The command line that starts ``command`` in its namespaces (``write_fd`` must be passed)."""
        unshare = shutil.which("unshare")
        if unshare is None:
            raise AmbError("`unshare` (util-linux) is no longer on PATH: cannot isolate the agent")
        init = [sys.executable, "-I", "-S", str(INIT), str(self.write_fd), "--"]
        return [*unshare_argv(unshare), *init, *command]

    def started(self, handle: subprocess.Popen[bytes]) -> int | None:
        """Wait for the init's first report: None once the agent runs, else the errno of its
        failed start (``AmbError`` when the namespace itself did not come up)."""
        self._close_write_end()
        line = self._line(START_TIMEOUT_S)
        if line == "started":
            return None
        if line is not None and line.startswith("error "):
            handle.wait()
            return int(line.split()[1])
        handle.kill()
        rc = handle.wait()
        why = "did not start in time" if line is None and rc == -signal.SIGKILL else f"exited with {rc}"
        raise AmbError(f"cannot start the agent in its namespaces: unshare {why}")

    def end(self) -> tuple[int, int | None] | None:
        """How the agent ended, (exit code, signal), as the init reported it; None if it could not
        (the init was killed, with everything in the namespace). Call once ``unshare`` has exited."""
        while (line := self._line(0)) is not None:
            self.ended = line
        if self.ended is None:
            return None
        what, _, value = self.ended.partition(" ")
        if what == "signal":
            return 128 + int(value), int(value)
        return int(value), None

    def close(self) -> None:
        self._close_write_end()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def _close_write_end(self) -> None:
        # Once: a second close could hit a descriptor the number was given to meanwhile.
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _line(self, timeout: float) -> str | None:
        """The next line from the init, waiting up to ``timeout`` seconds; None at its end."""
        while b"\n" not in self._pending:
            if not readable(self.read_fd, timeout):
                return None
            chunk = os.read(self.read_fd, 4096)
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode("ascii", "replace")
