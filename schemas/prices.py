"""Price tables and the price of one model call: shared by the scorer (a run's cost, offline) and the
recorder (``amb-record --max-cost``, live), so both charge a call the same.

Containment is explicit (``schemas.events.model_call.Usage``): ``input_total`` INCLUDES cache reads
and writes, ``output`` INCLUDES reasoning. So

    cost = (input_total − cache_read − cache_write)·p_in + cache_read·p_cache_read
           + cache_write·p_cache_write + output·p_out                       (per ``unit_tokens``)

where a table that gives no cache prices charges cached tokens as ordinary input (the paper's
"no cache discounts"), and reasoning tokens are output tokens (never added twice). A call through a
gateway that reported its own cost (``ModelCallCompleted.cost_usd``: OpenRouter's ``usage.cost``) is
charged that cost instead. A model the table does not list has no price (``None``), never 0.

Tables are TOML files: the built-in ones in ``schemas/prices/`` (the paper's Table 11 snapshot and
the public harness's prices) or any path; users add their own.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import msgspec

from schemas.errors import UsageError, quoted
from schemas.events import ModelCallCompleted
from schemas.userfile import is_file, read_text


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


@lru_cache(maxsize=4096)  # a table's few names, compared for every model call of every run
def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def builtin_dir() -> Path:
    return Path(str(resources.files("schemas").joinpath("prices")))


def load_table(ref: str) -> PriceTable:
    """A price table by built-in name (``openrouter-2026-05-28``) or TOML path."""
    path = Path(ref)
    if not is_file(path):
        path = builtin_dir() / f"{ref}.toml"
    if not is_file(path):
        raise UsageError(f"price table {quoted(ref)}: no such file and no built-in table of that name")
    try:
        return msgspec.convert(tomllib.loads(read_text(path, "price table")), PriceTable)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
        raise UsageError(f"price table {ref!r}: {e}") from e


Source = Literal["reported", "table"]


def call_cost(
    call: ModelCallCompleted, table: PriceTable, run_model: str | None
) -> tuple[float, Source] | None:
    """What one call costs and where the figure comes from; None when the table has no price for it.
    The model is looked up as the call served it, then as it was asked for, then as the run named it
    (``--model``); a cost the gateway reported wins over the table."""
    if call.cost_usd is not None:
        return call.cost_usd, "reported"
    price = table.find(call.model) or table.find(call.requested_model) or table.find(call.model or run_model)
    if price is None:
        return None
    u = call.usage
    fresh = max(u.input_total - u.cache_read - u.cache_write, 0)
    p_cr = price.input if price.cache_read is None else price.cache_read
    p_cw = price.input if price.cache_write is None else price.cache_write
    cost = fresh * price.input + u.cache_read * p_cr + u.cache_write * p_cw + u.output * price.output
    return cost / table.table.unit_tokens, "table"


def call_tokens(call: ModelCallCompleted) -> int:
    """The tokens a call counts against ``--max-tokens``: all input (cached included) plus all output
    (reasoning included), the scorer's ``tokens_in + tokens_out``."""
    return call.usage.input_total + call.usage.output
