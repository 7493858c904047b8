"""A run's budget (``amb-record --max-tokens N --max-cost USD --max-calls N``), kept by the proxy.

Every model call asks for admission before it is forwarded (a refused one never reaches the
upstream: ``recorder.proxy.refusal``) and settles when its record is written, priced as ``amb score``
prices it (``schemas.prices``). The rules under concurrency: docs/recording.md, "Budgets".
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Literal

import msgspec

from schemas.errors import UsageError
from schemas.events import BudgetLimits, BudgetSpent, ModelCallCompleted
from schemas.prices import PriceTable, call_cost, call_tokens, load_table

DEFAULT_PRICE_TABLE = "openrouter-2026-05-28"
"""The price table of the default scoring profile (``paper-2026-06``; a test checks they agree), so a
budget in dollars means what the default score's cost means."""

LimitName = Literal["max_calls", "max_tokens", "max_cost_usd"]
_FLAG = {"max_calls": "--max-calls", "max_tokens": "--max-tokens", "max_cost_usd": "--max-cost"}


def checked(limits: BudgetLimits) -> BudgetLimits:
    """The limits as the recorder keeps them: each one above 0 (else ``UsageError`` naming its
    ``amb-record`` flag), the price table named (``DEFAULT_PRICE_TABLE`` when none is)."""
    for name, flag in _FLAG.items():
        value = getattr(limits, name)
        if value is not None and not value > 0:
            raise UsageError(f"{flag} {value}: must be greater than 0")
    return msgspec.structs.replace(limits, price_table=limits.price_table or DEFAULT_PRICE_TABLE)


def limited(limits: BudgetLimits | None) -> bool:
    """True when ``limits`` sets any limit (a price table alone limits nothing)."""
    return limits is not None and (
        limits.max_tokens is not None or limits.max_cost_usd is not None or limits.max_calls is not None
    )


def recorded(limits: BudgetLimits) -> BudgetLimits:
    """The limits as ``run.started`` records them: the price table only when a cost limit uses it."""
    table = (limits.price_table or DEFAULT_PRICE_TABLE) if limits.max_cost_usd is not None else None
    return msgspec.structs.replace(limits, price_table=table)


@dataclass(frozen=True)
class Refusal:
    limit: LimitName
    message: str


WAIT = "wait"
"""``try_admit``: the call cannot be decided until calls in flight settle."""


class Budget:
    """Thread-safe: admission runs on the proxy's event loop, settling on the sink's threads."""

    def __init__(
        self, limits: BudgetLimits, *, run_model: str | None = None, table: PriceTable | None = None
    ):
        self.limits = limits = checked(limits)
        self.run_model = run_model
        if table is None and limits.max_cost_usd is not None:
            table = load_table(limits.price_table or DEFAULT_PRICE_TABLE)
        if table is not None and run_model and table.find(run_model) is None:
            raise UsageError(
                f"--max-cost: model {run_model!r} has no price in table {table.table.name} "
                "(name another with --price-table)"
            )
        self.table = table
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.calls = 0
        self.tokens = 0
        self._costs: list[tuple[int, float]] = []
        """(seq of the call's event, its cost): summed in the log's order, as the scorer sums."""
        self.unpriced: str | None = None
        """A call's model with no price in the table: the cost is unknown from then on."""
        self._largest_tokens: int | None = None
        self._largest_cost: float | None = None
        self.refused = 0
        self.first_refusal: float | None = None
        """``time.monotonic()`` of the first refusal (the recorder stops the agent some time after)."""
        self.stopped_by: LimitName | None = None

    # -- admission (the proxy's event loop) -----------------------------------------------------

    def try_admit(self, call_id: str) -> Refusal | str | None:
        """None: admitted (reserved; it must settle). A ``Refusal``: never forward it. ``WAIT``:
        ask again when calls in flight have settled (``admit`` does that)."""
        with self._lock:
            return self._decide(call_id)

    async def admit(self, call_id: str) -> Refusal | None:
        """Admission, waiting while it depends on calls in flight."""
        loop = asyncio.get_running_loop()
        while True:
            woken: asyncio.Future[None] = loop.create_future()
            with self._lock:
                verdict = self._decide(call_id)
                if verdict == WAIT:
                    self._waiters.append((loop, woken))
            if not isinstance(verdict, str):
                return verdict
            await woken

    def _decide(self, call_id: str) -> Refusal | str | None:
        lim = self.limits
        flying = len(self._in_flight)
        if lim.max_calls is not None and self.calls + flying >= lim.max_calls:
            return self._refuse("max_calls", f"--max-calls {lim.max_calls} reached")
        undecided = False
        if lim.max_tokens is not None:
            if self.tokens >= lim.max_tokens:
                return self._refuse(
                    "max_tokens", f"--max-tokens {lim.max_tokens} reached ({self.tokens} tokens used)"
                )
            if flying and (
                self._largest_tokens is None or self.tokens + flying * self._largest_tokens >= lim.max_tokens
            ):
                undecided = True
        if lim.max_cost_usd is not None:
            if self.unpriced is not None:
                return self._refuse(
                    "max_cost_usd",
                    f"--max-cost cannot be kept: model {self.unpriced!r} has no price in table "
                    f"{lim.price_table}",
                )
            spent = self._cost()
            if spent >= lim.max_cost_usd:
                return self._refuse(
                    "max_cost_usd",
                    f"--max-cost {lim.max_cost_usd:g} USD reached ({spent:.6f} USD spent, price table "
                    f"{lim.price_table})",
                )
            if flying and (
                self._largest_cost is None or spent + flying * self._largest_cost >= lim.max_cost_usd
            ):
                undecided = True
        if undecided:
            return WAIT
        self._in_flight.add(call_id)
        return None

    def _refuse(self, limit: LimitName, why: str) -> Refusal:
        self.refused += 1
        if self.first_refusal is None:
            self.first_refusal = time.monotonic()
            self.stopped_by = limit
        return Refusal(limit, f"amb-record: this run's budget is exhausted: {why}; model calls are refused")

    # -- settling (the sink's threads) ----------------------------------------------------------

    def settle(self, call_id: str, event: ModelCallCompleted | None, seq: int) -> None:
        """The call ``call_id`` has been recorded as ``event`` (None: its record could not be written,
        so what it used is unknown). Calls that were never admitted are ignored."""
        with self._lock:
            if call_id not in self._in_flight:
                return
            self._in_flight.discard(call_id)
            self.calls += 1
            if event is None:
                self.unpriced = self.unpriced or "(a call whose record could not be written)"
                self.tokens = max(self.tokens, self.limits.max_tokens or 0)
            else:
                used = call_tokens(event)
                self.tokens += used
                self._largest_tokens = max(self._largest_tokens or 0, used)
                if self.table is not None:
                    priced = call_cost(event, self.table, self.run_model)
                    if priced is None:
                        self.unpriced = self.unpriced or (event.model or self.run_model or "(unknown)")
                    else:
                        self._costs.append((seq, priced[0]))
                        self._largest_cost = max(self._largest_cost or 0.0, priced[0])
            waiters, self._waiters = self._waiters, []
        for loop, woken in waiters:
            loop.call_soon_threadsafe(_wake, woken)

    def _cost(self) -> float:
        total = 0.0
        for _, cost in sorted(self._costs):
            total += cost
        return total

    def cost_usd(self) -> float | None:
        """The run's cost so far, rounded as the scorer rounds it; None if unknown or not kept."""
        if self.table is None or self.unpriced is not None:
            return None
        return round(self._cost(), 6)

    def exceeded(self) -> bool:
        """A call was refused, or the spend went past a limit (the call that crossed it completed)."""
        with self._lock:
            return self.limit_hit() is not None

    def limit_hit(self) -> LimitName | None:
        """The limit that refused a call, else one the spend went past, else None."""
        if self.stopped_by is not None:
            return self.stopped_by
        lim = self.limits
        if lim.max_tokens is not None and self.tokens > lim.max_tokens:
            return "max_tokens"
        if lim.max_cost_usd is not None and self.table is not None and self._cost() > lim.max_cost_usd:
            return "max_cost_usd"
        return None

    def spent(self) -> BudgetSpent:
        with self._lock:
            return BudgetSpent(
                calls=self.calls,
                tokens=self.tokens,
                cost_usd=self.cost_usd(),
                price_table=self.table.table.name if self.table is not None else None,
                refused=self.refused,
                limit=self.limit_hit(),
            )

    def reason(self) -> str:
        """One line for ``run.finished``: which limit, what was spent, how many calls were refused."""
        s = self.spent()
        lim = self.limits
        flag = _FLAG[s.limit] if s.limit is not None else "the budget"
        value = {
            "max_calls": lim.max_calls,
            "max_tokens": lim.max_tokens,
            "max_cost_usd": f"{lim.max_cost_usd:g} USD" if lim.max_cost_usd is not None else None,
        }.get(s.limit or "")
        parts = [f"{s.calls} calls", f"{s.tokens} tokens"]
        if s.cost_usd is not None:
            parts.append(f"{s.cost_usd:.6f} USD ({s.price_table})")
        elif lim.max_cost_usd is not None:
            parts.append(f"cost unknown ({self.unpriced} has no price in {lim.price_table})")
        refused = f"{s.refused} later call{'s' if s.refused != 1 else ''} refused"
        return f"budget exceeded: {flag} {value} reached; spent {', '.join(parts)}; {refused}"


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
