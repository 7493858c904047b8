"""Cost: recorded token usage priced offline against a named, dated price table (docs/scoring.md).

The price of one call is ``schemas.prices.call_cost``, shared with the recorder's live budget so both
charge a call the same. A model the table does not list leaves the run's cost *unscored* with the
reason, never 0. ``cost_source`` says what a run's cost came from: ``reported``, ``table``, or
``reported+table`` when its calls were priced both ways; ``calls_reported`` counts the former.
"""

from __future__ import annotations

from typing import Any

import msgspec

from replay.summary import Tokens
from schemas.prices import ModelPrice, PriceTable, TableMeta, call_cost, load_table, normalise
from scorer.trajectory import Trajectory

__all__ = ["ModelPrice", "PriceTable", "TableMeta", "load_table", "normalise", "price_run"]


def price_run(traj: Trajectory, table: PriceTable) -> dict[str, Any]:
    """Token totals and the cost of a run's model calls under ``table``."""
    tok = Tokens()
    estimated = False
    cost = 0.0
    unpriced: set[str] = set()
    by_table = by_report = 0
    for _, call in traj.model_calls:
        tok.add(call.usage)
        estimated |= not call.usage.reported
        priced = call_cost(call, table, traj.model)
        if priced is None:
            unpriced.add(call.model or traj.model or "(unknown model)")
            continue
        cost += priced[0]
        by_report += priced[1] == "reported"
        by_table += priced[1] != "reported"
    why = f"not in price table {table.table.name}: {', '.join(sorted(unpriced))}" if unpriced else None
    source = "+".join(name for name, n in (("reported", by_report), ("table", by_table)) if n) or None
    return {
        "tokens": msgspec.to_builtins(tok),
        "cost": None if unpriced else round(cost, 6),
        "cost_reason": why,
        "price_table": table.table.name,
        "estimated": estimated,
        "cost_source": source,
        "calls_reported": by_report,
    }
