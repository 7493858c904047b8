"""The budget's admission rule on its own (``recorder.budget``): limits hold as if the calls had run
one after the other, however they race; the live cost is the scorer's; bad limits are refused."""

from __future__ import annotations

import asyncio
import random

import pytest

from recorder.budget import DEFAULT_PRICE_TABLE, WAIT, Budget, Refusal, checked
from schemas.errors import UsageError
from schemas.events import BudgetLimits, ModelCallCompleted, Usage
from schemas.prices import load_table
from scorer import profile
from scorer.cost import price_run
from scorer.trajectory import Trajectory


def call(call_id: str, tokens_in: int, tokens_out: int, model: str = "gpt-5.4") -> ModelCallCompleted:
    return ModelCallCompleted(
        call_id=call_id,
        provider="openai",
        api="chat.completions",
        model=model,
        usage=Usage(input_total=tokens_in, output=tokens_out),
    )


def sequential(usages: list[int], limit: int) -> int:
    """How many calls one-after-the-other would forward: each while the spend is under the limit."""
    spent = n = 0
    for u in usages:
        if spent >= limit:
            break
        spent += u
        n += 1
    return n


async def race(budget: Budget, usages: list[int], seed: int, stagger: bool = False) -> list[str]:
    """Every call asks at once (or, staggered, in list order); an admitted call settles after a random
    delay with its usage. Returns the admitted calls, after checking the invariant: they are the
    first calls in the order the budget decided, and as many as one-after-the-other would forward."""
    rng = random.Random(seed)
    decided: list[tuple[int, bool]] = []
    seq = iter(range(10_000))

    async def one(i: int) -> None:
        await asyncio.sleep(i * 0.0005 if stagger else rng.random() * 0.002)
        refusal = await budget.admit(f"c{i}")
        decided.append((i, refusal is None))
        if refusal is None:
            await asyncio.sleep(rng.random() * 0.005)
            budget.settle(f"c{i}", call(f"c{i}", usages[i], 0), next(seq))

    await asyncio.gather(*(one(i) for i in range(len(usages))))
    admitted = [i for i, ok in decided if ok]
    assert [ok for _, ok in decided] == [True] * len(admitted) + [False] * (len(decided) - len(admitted))
    if budget.limits.max_tokens is not None:
        assert len(admitted) == sequential([usages[i] for i, _ in decided], budget.limits.max_tokens)
    return [f"c{i}" for i in admitted]


@pytest.mark.parametrize("seed", range(8))
def test_tokens_hold_exactly_under_concurrency(seed):
    rng = random.Random(seed)
    per_call = rng.randint(50, 300)
    limit = rng.randint(1, 3000)
    usages = [per_call] * 40
    budget = Budget(BudgetLimits(max_tokens=limit))
    admitted = asyncio.run(race(budget, usages, seed))
    assert len(admitted) == sequential(usages, limit)  # all calls the same size: any order
    assert budget.calls == len(admitted) and budget.refused == 40 - len(admitted)


@pytest.mark.parametrize("seed", range(4))
def test_calls_hold_exactly_and_never_wait(seed):
    budget = Budget(BudgetLimits(max_calls=7))
    admitted = asyncio.run(race(budget, [10] * 30, seed))
    assert len(admitted) == 7 and budget.refused == 23


def test_shrinking_calls_stay_exact_and_a_growing_one_is_the_documented_bound():
    # Calls no bigger than the first are decided exactly (``race`` checks it, in the order decided).
    usages = [300, 200, 200, 100, 100, 100, 50, 50, 50, 50]
    for seed in range(4):
        budget = Budget(BudgetLimits(max_tokens=1000))
        asyncio.run(race(budget, usages, seed, stagger=True))
    # A call bigger than every earlier one can let calls admitted beside it through: what the module
    # says. Here every call is admitted beside a small first one and the spend ends above the limit.
    b = Budget(BudgetLimits(max_tokens=100))
    assert b.try_admit("a") is None
    b.settle("a", call("a", 10, 0), 0)
    assert b.try_admit("b") is None  # 10 spent, nothing in flight
    assert b.try_admit("c") is None  # 10 + 1×10 < 100: admitted beside b
    b.settle("b", call("b", 500, 0), 1)
    b.settle("c", call("c", 10, 0), 2)
    assert b.tokens == 520 and isinstance(b.try_admit("d"), Refusal)


def test_waiting_and_refusing_are_told_apart():
    b = Budget(BudgetLimits(max_tokens=100))
    assert b.try_admit("a") is None
    assert b.try_admit("b") == WAIT  # nothing is known of a call's size before the first settles
    b.settle("a", call("a", 60, 40), 0)
    refusal = b.try_admit("b")
    assert isinstance(refusal, Refusal) and refusal.limit == "max_tokens"
    assert "--max-tokens 100 reached (100 tokens used)" in refusal.message
    assert b.exceeded() and b.reason().startswith("budget exceeded: --max-tokens 100 reached; spent 1 calls")


def test_an_unsettled_call_never_blocks_the_rest_and_unknown_usage_fails_closed():
    b = Budget(BudgetLimits(max_tokens=1000))
    assert b.try_admit("a") is None
    b.settle("a", None, -1)  # its record could not be written: what it used is unknown
    assert isinstance(b.try_admit("b"), Refusal)
    b.settle("never-admitted", call("x", 5, 5), 1)  # ignored
    assert b.calls == 1


def test_live_cost_equals_the_scorers_cost():
    rng = random.Random(3)
    table = load_table(DEFAULT_PRICE_TABLE)
    b = Budget(BudgetLimits(max_cost_usd=1e9))
    events = []
    for i in range(200):
        model = rng.choice(["gpt-5.4", "claude-opus-4.6", "glm-5"])
        usage = Usage(
            input_total=rng.randint(100, 90_000),
            cache_read=rng.randint(0, 50),
            cache_write=rng.randint(0, 50),
            output=rng.randint(0, 9_000),
        )
        ev = ModelCallCompleted(
            call_id=f"c{i}", provider="openai", api="chat.completions", model=model, usage=usage
        )
        events.append((f"c{i}", ev))
    # Settled out of order (as concurrent calls are), summed in the log's order, as the scorer sums.
    for i in rng.sample(range(200), 200):
        assert b.try_admit(f"c{i}") is None
        b.settle(f"c{i}", events[i][1], i)
    scored = price_run(Trajectory(run_id="r", model_calls=events), table)
    assert (
        b.cost_usd() == scored["cost"] and b.tokens == scored["tokens"]["input"] + scored["tokens"]["output"]
    )


def test_the_default_price_table_is_the_default_profiles():
    assert profile.load().profile.cost.price_table == DEFAULT_PRICE_TABLE


@pytest.mark.parametrize(
    ("limits", "needle"),
    [
        (dict(max_calls=0), "--max-calls 0: must be greater than 0"),
        (dict(max_tokens=-5), "--max-tokens -5"),
        (dict(max_cost_usd=float("nan")), "--max-cost nan"),
    ],
)
def test_bad_limits(limits, needle):
    with pytest.raises(UsageError, match=needle):
        checked(BudgetLimits(**limits))


def test_an_unpriced_model_cannot_have_a_cost_budget():
    with pytest.raises(UsageError, match="model 'mystery' has no price in table openrouter-2026-05-28"):
        Budget(BudgetLimits(max_cost_usd=1.0), run_model="mystery")
    b = Budget(BudgetLimits(max_cost_usd=1.0))
    assert b.try_admit("a") is None
    b.settle("a", call("a", 10, 10, model="mystery"), 0)
    refusal = b.try_admit("b")
    assert isinstance(refusal, Refusal) and "model 'mystery' has no price" in refusal.message
    assert b.cost_usd() is None
