"""A call through a gateway is charged the cost the gateway reported; the others by the dated price
table; the run says which (hand-computed)."""

from __future__ import annotations

import pytest

from schemas.events import ModelCallCompleted, RunStarted, Usage
from scorer import cost
from scorer.trajectory import fold
from tests.scorer.test_audit import run


def call(i: int, model: str | None, usage: Usage, **extra) -> ModelCallCompleted:
    return ModelCallCompleted(
        call_id=f"c{i}", provider="openai", api="chat.completions", model=model, usage=usage, **extra
    )


START = RunStarted(task="kidney-seg", tier="lite", model="claude-opus-4.6")
TABLE = cost.load_table("openrouter-2026-05-28")  # claude-opus-4.6: $5 in, $25 out per 1M, no cache price


def test_reported_cost_wins_and_the_source_is_marked():
    router = call(
        1,
        "fakevendor/unlisted-model",  # not in the table: the reported cost still prices it
        Usage(input_total=1_000_000, output=1_000_000),
        cost_usd=0.25,
        upstream="openrouter",
    )
    direct = call(2, "claude-opus-4.6", Usage(input_total=200_000, output=40_000))
    t = fold("r", run(START, router, direct), lambda r: b"")
    priced = cost.price_run(t, TABLE)
    # 0.25 reported + (200k × $5 + 40k × $25) / 1M = 0.25 + 1.0 + 1.0
    assert priced["cost"] == pytest.approx(2.25) and priced["cost_reason"] is None
    assert (priced["cost_source"], priced["calls_reported"]) == ("reported+table", 1)
    only_router = cost.price_run(fold("r", run(START, router), lambda r: b""), TABLE)
    assert (only_router["cost"], only_router["cost_source"]) == (pytest.approx(0.25), "reported")
    only_table = cost.price_run(fold("r", run(START, direct), lambda r: b""), TABLE)
    assert (only_table["cost"], only_table["cost_source"]) == (pytest.approx(2.0), "table")


def test_a_served_model_the_table_lacks_falls_back_to_the_requested_one():
    served = call(
        1,
        "anthropic/claude-opus-4.6-20260101",  # a dated name the table does not list
        Usage(input_total=1_000_000, output=0),
        requested_model="claude-opus-4.6",
    )
    priced = cost.price_run(fold("r", run(START, served), lambda r: b""), TABLE)
    assert priced["cost"] == pytest.approx(5.0) and priced["cost_source"] == "table"
