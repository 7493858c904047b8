"""A sweep file's budget keys reach every run: the sweep spec, each run spec, amb-record's limits."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from recorder.budget import DEFAULT_PRICE_TABLE, Budget
from schemas.events import BudgetLimits
from sweeps.plan import SweepError, load_sweep
from sweeps.spec import Agent, Cell, CellLimits, RunSpec

BASE = 'name = "x"\ntasks = ["kidney-seg"]\nagents = [{name = "a", command = ["true"]}]\n'


def _run_spec(budget: BudgetLimits | None) -> RunSpec:
    return RunSpec(
        cell=Cell(sweep="x", agent="a", task="kidney-seg", tier="lite", repeat=1),
        attempt=1,
        agent=Agent(name="a", command=["true"]),
        limits=CellLimits(time_limit_s=60, budget=budget),
        backend="local",
        data="/nonexistent",
        shard_root="/nonexistent",
    )


def test_budget_keys_reach_amb_record(tmp_path: Path):
    (tmp_path / "s.toml").write_text(
        BASE + 'max_calls = 40\nmax_tokens = 200000\nmax_cost = 2.5\nprice_table = "harness-2026-04"\n'
    )
    budget = load_sweep(tmp_path / "s.toml").budget
    assert budget == BudgetLimits(
        max_tokens=200000, max_cost_usd=2.5, max_calls=40, price_table="harness-2026-04"
    )
    # Through the run spec's JSON, as an executor on another node reads it: the same limits, which
    # the exec hands to the recorder as they are.
    spec = msgspec.json.decode(msgspec.json.encode(_run_spec(budget)), type=RunSpec)
    assert spec.limits.budget == budget
    assert Budget(budget).limits.price_table == "harness-2026-04"
    (tmp_path / "s.toml").write_text(BASE + "max_calls = 3\n")
    only_calls = load_sweep(tmp_path / "s.toml").budget
    assert only_calls == BudgetLimits(max_calls=3)
    assert Budget(only_calls).limits.price_table == DEFAULT_PRICE_TABLE  # the recorder's default
    (tmp_path / "s.toml").write_text(BASE)
    assert load_sweep(tmp_path / "s.toml").budget is None


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("max_calls = 0", "max_calls"),
        ("max_tokens = 1.5", "max_tokens"),
        ('max_cost = "lots"', "max_cost"),
        ("max_cost = -1", "max_cost"),
        ("price_table = 3", "price_table"),
        ('price_table = "harness-2026-04"', "set max_cost"),
    ],
)
def test_bad_budget_keys_are_one_error_naming_the_line(tmp_path: Path, line: str, needle: str):
    (tmp_path / "s.toml").write_text(BASE + line + "\n")
    with pytest.raises(SweepError, match=needle) as e:
        load_sweep(tmp_path / "s.toml")
    assert "s.toml:4" in str(e.value)
