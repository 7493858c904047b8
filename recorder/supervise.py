"""Watching a recorded agent until it ends (``recorder.run``): the stop signals amb-record receives
are forwarded to it, its time limit and its budget are enforced, and its end becomes the run's
status. Also the one place a run's close holds stop signals until it is done.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from recorder.backend import Backend, Exit
from recorder.budget import Budget

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Passed on to the agent while it runs; held while a run closes."""
POLL_S = 0.05


@dataclass
class _Stops:
    """Why amb-record stopped the agent, if it did: the moments it sent SIGTERM."""

    timed_out_at: float | None = None
    budget_stop_at: float | None = None


def supervise(
    backend: Backend, handle: object, time_limit_s: float | None, grace_s: float, budget: Budget | None = None
) -> tuple[Exit, str, str | None]:
    """Wait for the agent; forward SIGINT/SIGTERM; enforce the time limit; stop an agent that goes on
    after its budget refused a call (``grace_s`` seconds after the first refusal, as at a time limit).
    Returns its exit, the run's status and the reason for it."""
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        backend.send_signal(handle, signum)

    with _handled_by(forward):
        exit_, stops = _wait(backend, handle, time_limit_s, grace_s, budget)
    return (exit_, *_status(exit_, stops, received, time_limit_s, grace_s))


def _wait(
    backend: Backend, handle: object, time_limit_s: float | None, grace_s: float, budget: Budget | None
) -> tuple[Exit, _Stops]:
    """The agent's exit: SIGTERM at the time limit or ``grace_s`` after its budget's first refused
    call, SIGKILL ``grace_s`` after that."""
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    stops = _Stops()
    while True:
        step = POLL_S
        if deadline is not None and stops.timed_out_at is None:
            step = max(0.0, min(step, deadline - time.monotonic()))
        exit_ = backend.wait(handle, step)
        if exit_ is not None:
            return exit_, stops
        now = time.monotonic()
        stopping = stops.timed_out_at if stops.timed_out_at is not None else stops.budget_stop_at
        refused_at = budget.first_refusal if budget is not None else None
        if deadline is not None and stopping is None and now >= deadline:
            stops.timed_out_at = now
            backend.send_signal(handle, signal.SIGTERM)
        elif stopping is None and refused_at is not None and now >= refused_at + grace_s:
            stops.budget_stop_at = now
            backend.send_signal(handle, signal.SIGTERM)
        elif stopping is not None and now >= stopping + grace_s:
            backend.kill(handle)
            exit_ = backend.wait(handle, None)
            assert exit_ is not None
            return exit_, stops


def _status(
    exit_: Exit, stops: _Stops, received: list[int], time_limit_s: float | None, grace_s: float
) -> tuple[str, str | None]:
    """The run's status and its reason, from how the agent ended."""
    how = "SIGKILL after the grace period" if exit_.signal == signal.SIGKILL else "SIGTERM"
    if stops.timed_out_at is not None:
        return "timeout", f"time limit of {time_limit_s:g}s reached; stopped by {how}"
    if stops.budget_stop_at is not None:
        return (
            "budget_exceeded",
            f"the agent was still running {grace_s:g}s after its first refused call; stopped by {how}",
        )
    if received:
        names = ", ".join(signal.Signals(s).name for s in received)
        return "killed", f"amb-record received {names} and forwarded it to the agent"
    if exit_.failure is not None:  # the agent's environment ended it (its container ran out of memory)
        return "failed", exit_.failure
    if exit_.lost is not None:  # the backend's record of the agent ended first (its shim died)
        return "recorder_error", exit_.lost
    if exit_.signal is not None:
        return "killed", f"the agent was killed by {signal.Signals(exit_.signal).name}"
    return ("completed" if exit_.code == 0 else "failed"), None


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Stop signals landing inside are held, then delivered to the handlers of before, each once.

    Closing a run takes seconds, and a second stop signal often lands then (a Ray task's cancel,
    then its worker's death): raised inside the close, it would leave the run without its
    ``run.finished``. Only the main thread runs signal handlers; elsewhere nothing is held."""
    held: list[int] = []
    try:
        with _handled_by(lambda signum, _frame: held.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)


@contextmanager
def _handled_by(handler: Callable[[int, Any], object]) -> Iterator[None]:
    """``STOP_SIGNALS`` go to ``handler`` inside (in the main thread: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, signal.SIG_DFL if before is None else before)
