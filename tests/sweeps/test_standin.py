"""The stand-in between an engine's worker and an exec (sweeps/standin.py): whatever kills the
stand-in, even SIGKILL aimed at its whole process group, the exec behind it gets SIGTERM; stop signals
are forwarded; the exec's status is the stand-in's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps import standin

# The exec's stand-in in these tests: says it is ready, writes the signal that ends it, exits 40 + N.
CHILD = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def on(signum, _frame):
    out.joinpath("got").write_text(signal.Signals(signum).name)
    raise SystemExit(40 + signum)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, on)
out.joinpath("pid").write_text(str(__import__("os").getpid()))
time.sleep(120)
"""


def _start(tmp_path: Path, *, new_session: bool = False) -> subprocess.Popen[bytes]:
    argv = standin.command([sys.executable, "-c", CHILD, str(tmp_path)])
    proc = subprocess.Popen(argv, start_new_session=new_session)
    _wait_file(tmp_path / "pid", proc)
    return proc


def _wait_file(path: Path, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30) -> str:
    """The file's text once it has any: it is made empty, then written (one write, never empty)."""
    deadline = time.monotonic() + timeout
    while not (text := path.read_text() if path.exists() else ""):
        if proc is not None:
            assert proc.poll() is None, f"the stand-in ended with {proc.returncode} before {path.name}"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    return text


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_sigkill_to_the_stand_in_and_its_group_reaches_the_exec_as_sigterm(tmp_path: Path) -> None:
    # What Ray does when a worker exits: SIGKILL to its direct children, and to its process group.
    proc = _start(tmp_path, new_session=True)
    child = int((tmp_path / "pid").read_text())
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert _wait_file(tmp_path / "got") == "SIGTERM"
    assert _gone(child)  # the exec itself was never SIGKILLed: it ended by its own handler


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_is_forwarded_and_the_exit_status_is_the_execs(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc = _start(tmp_path)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 40 + sig
    assert (tmp_path / "got").read_text() == sig.name


def test_an_exec_killed_by_a_signal_is_128_plus_that_signal(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL


def test_a_plain_exit_status_passes_through() -> None:
    argv = standin.command([sys.executable, "-c", "raise SystemExit(3)"])
    assert subprocess.run(argv, timeout=60).returncode == 3


def test_a_command_that_cannot_run_is_127_and_one_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-amb")
    done = subprocess.run(
        standin.command([missing, "sweep", "exec"]), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 127
    assert done.stderr.count("\n") == 1 and missing in done.stderr and "Traceback" not in done.stderr


def test_no_command_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sweeps.standin"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "usage" in done.stderr


def test_a_sweeps_package_in_the_folder_it_starts_in_is_not_the_stand_in(tmp_path):
    planted = tmp_path / "sweeps"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "standin.py").write_text("import pathlib; pathlib.Path('planted').write_text('ran')\n")
    done = subprocess.run(standin.command([sys.executable, "-c", "raise SystemExit(7)"]), cwd=tmp_path)
    assert done.returncode == 7 and not (tmp_path / "planted").exists()
