"""A sweep file's budget keys reach every run: the sweep spec, each run spec, amb-record's limits."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from recorder.budget import Limits as RecorderLimits
from sweeps.exec import _budget
from sweeps.plan import SweepError, load_sweep
from sweeps.spec import Agent, Budget, Cell, Limits, RunSpec

BASE = 'name = "x"\ntasks = ["kidney-seg"]\nagents = [{name = "a", command = ["true"]}]\n'


def _run_spec(budget: Budget | None) -> RunSpec:
    return RunSpec(
        cell=Cell(sweep="x", agent="a", task="kidney-seg", tier="lite", repeat=1),
        attempt=1,
        agent=Agent(name="a", command=["true"]),
        limits=Limits(time_limit_s=60, budget=budget),
        backend="local",
        data="/nonexistent",
        shard_root="/nonexistent",
    )


def test_budget_keys_reach_amb_record(tmp_path: Path):
    (tmp_path / "s.toml").write_text(
        BASE + 'max_calls = 40\nmax_tokens = 200000\nmax_cost = 2.5\nprice_table = "harness-2026-04"\n'
    )
    budget = load_sweep(tmp_path / "s.toml").budget
    assert budget == Budget(max_tokens=200000, max_cost_usd=2.5, max_calls=40, price_table="harness-2026-04")
    # Through the run spec's JSON, as an executor on another node reads it.
    spec = msgspec.json.decode(msgspec.json.encode(_run_spec(budget)), type=RunSpec)
    assert _budget(spec) == RecorderLimits(
        max_tokens=200000, max_cost_usd=2.5, max_calls=40, price_table="harness-2026-04"
    )
    (tmp_path / "s.toml").write_text(BASE + "max_calls = 3\n")
    only_calls = load_sweep(tmp_path / "s.toml").budget
    assert _budget(_run_spec(only_calls)) == RecorderLimits(max_calls=3)  # the default price table
    (tmp_path / "s.toml").write_text(BASE)
    assert load_sweep(tmp_path / "s.toml").budget is None
    assert _budget(_run_spec(None)) is None


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
