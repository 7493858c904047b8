"""A sweep file's budget keys become amb-record's budget options for every cell."""

from __future__ import annotations

import pytest

from agents.sweep import SweepError, load_sweep

BASE = 'name = "x"\ntasks = ["kidney-seg"]\nagents = [{name = "a", command = ["true"]}]\n'


def test_budget_keys_are_passed_to_every_run(tmp_path):
    (tmp_path / "s.toml").write_text(
        BASE + 'max_calls = 40\nmax_tokens = 200000\nmax_cost = 2.5\nprice_table = "harness-2026-04"\n'
    )
    args = load_sweep(tmp_path / "s.toml").budget_args
    assert args == [
        "--max-tokens",
        "200000",
        "--max-cost",
        "2.5",
        "--max-calls",
        "40",
        "--price-table",
        "harness-2026-04",
    ]
    (tmp_path / "s.toml").write_text(BASE)
    assert load_sweep(tmp_path / "s.toml").budget_args == []


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("max_calls = 0", "'max_calls' must be a positive integer"),
        ("max_tokens = 1.5", "'max_tokens' must be a positive integer"),
        ('max_cost = "lots"', "'max_cost' must be a positive number"),
        ("max_cost = true", "'max_cost' must be a positive number"),
        ("price_table = 3", "price_table"),
    ],
)
def test_bad_budget_keys_are_one_error(tmp_path, line, needle):
    (tmp_path / "s.toml").write_text(BASE + line + "\n")
    with pytest.raises(SweepError, match=needle):
        load_sweep(tmp_path / "s.toml")
