"""Cost: recorded token usage priced offline against a named, dated price table.

Containment is explicit (``schemas.events.model_call.Usage``): ``input_total`` INCLUDES cache reads
and writes, ``output`` INCLUDES reasoning. So

    cost = (input_total − cache_read − cache_write)·p_in + cache_read·p_cache_read
           + cache_write·p_cache_write + output·p_out                       (per ``unit_tokens``)

where a table that gives no cache prices charges cached tokens as ordinary input (the paper's
"no cache discounts"), and reasoning tokens are output tokens (never added twice). A model the table
does not list leaves the cost *unscored* with the reason, never 0. Usage the provider did not report
(the proxy estimated it) is flagged ``estimated``.

A call through a gateway that reported its own cost (``ModelCallCompleted.cost_usd``: OpenRouter's
``usage.cost``) is charged that cost, not the table's price: the gateway knows which provider served
it and at what rate. ``cost_source`` says what a run's cost came from: ``reported``, ``table``, or
``reported+table`` when its calls were priced both ways; ``calls_reported`` counts the former.

Tables are TOML files: the built-in ones in ``scorer/prices/`` (the paper's Table 11 snapshot and
the public harness's prices) or any path; users add their own.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from schemas.errors import UsageError
from schemas.events import ModelCallCompleted
from scorer.trajectory import Trajectory


class _Cfg(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class TableMeta(_Cfg, frozen=True):
    name: str
    date: str
    currency: str = "USD"
    unit_tokens: int = 1_000_000
    source: str = ""


class ModelPrice(_Cfg, frozen=True):
    name: str
    match: list[str]
    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


class PriceTable(_Cfg, frozen=True):
    table: TableMeta
    model: list[ModelPrice]

    def find(self, model: str | None) -> ModelPrice | None:
        if not model:
            return None
        m = normalise(model)
        for entry in self.model:
            if m in (normalise(x) for x in entry.match + [entry.name]):
                return entry
        tail = normalise(model.split("/")[-1])
        for entry in self.model:
            if tail in (normalise(x.split("/")[-1]) for x in entry.match):
                return entry
        return None


def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def load_table(ref: str) -> PriceTable:
    path = Path(ref)
    if not path.is_file():
        path = Path(str(resources.files("scorer").joinpath("prices", f"{ref}.toml")))
    if not path.is_file():
        raise UsageError(f"price table {ref!r}: no such file and no built-in table of that name")
    try:
        return msgspec.convert(tomllib.loads(path.read_text(encoding="utf-8")), PriceTable)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
        raise UsageError(f"price table {ref!r}: {e}") from e


def call_cost(call: ModelCallCompleted, table: PriceTable, run_model: str | None) -> float | None:
    """One call's cost, unrounded: what the gateway reported, else its tokens at the table's price;
    None when the table does not list its model. (``amb watch`` sums these as ``price_run`` does.)"""
    if call.cost_usd is not None:
        return call.cost_usd
    price = table.find(call.model) or table.find(call.requested_model) or table.find(call.model or run_model)
    if price is None:
        return None
    u = call.usage
    fresh = max(u.input_total - u.cache_read - u.cache_write, 0)
    p_cr = price.input if price.cache_read is None else price.cache_read
    p_cw = price.input if price.cache_write is None else price.cache_write
    return (
        fresh * price.input + u.cache_read * p_cr + u.cache_write * p_cw + u.output * price.output
    ) / table.table.unit_tokens


def price_run(traj: Trajectory, table: PriceTable) -> dict[str, Any]:
    """Token totals and the cost of a run's model calls under ``table``."""
    tok = {"input": 0, "cache_read": 0, "cache_write": 0, "output": 0, "reasoning": 0}
    estimated = False
    cost = 0.0
    unpriced: set[str] = set()
    by_table = by_report = 0
    for _, call in traj.model_calls:
        u = call.usage
        tok["input"] += u.input_total
        tok["cache_read"] += u.cache_read
        tok["cache_write"] += u.cache_write
        tok["output"] += u.output
        tok["reasoning"] += u.reasoning
        estimated |= not u.reported
        charged = call_cost(call, table, traj.model)
        if charged is None:
            unpriced.add(call.model or traj.model or "(unknown model)")
            continue
        if call.cost_usd is not None:
            by_report += 1
        else:
            by_table += 1
        cost += charged
    return {
        "tokens": tok,
        "cost": None if unpriced else round(cost, 6),
        "cost_reason": f"not in price table {table.table.name}: {', '.join(sorted(unpriced))}"
        if unpriced
        else None,
        "price_table": table.table.name,
        "estimated": estimated,
        "cost_source": "+".join(name for name, n in (("reported", by_report), ("table", by_table)) if n)
        or None,
        "calls_reported": by_report,
    }
