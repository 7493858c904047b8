"""Measuring judges: ``amb judge compare``, and the agreement tables ``amb score --repeat`` prints."""

from __future__ import annotations

import json
from typing import Any

import click

from amb.common import store_option
from amb.output import cell, table
from schemas.errors import UsageError
from scorer import ledger
from scorer.profile import load as load_profile


def _alpha(v: float | None) -> str:
    return "— (no variation)" if v is None else f"{v:.4f}"


def agreement_text(table_data: dict[str, Any]) -> str:
    rows = []
    for i in table_data["items"]:
        runs = ", ".join(i["flipping_runs"][:5]) + (" ..." if len(i["flipping_runs"]) > 5 else "")
        rows.append(
            [i["item"], str(i["units"]), cell(i["agreement"]), _alpha(i["alpha"]), str(i["flips"]), runs]
        )
    o = table_data["overall"]
    return (
        table(["item", "units", "agreement", "alpha", "flips", "flipping runs"], rows)
        + f"\noverall: {o['units']} units, agreement {cell(o['agreement'])}, Krippendorff's alpha "
        f"(nominal) {_alpha(o['alpha'])}, {o['flips']} flipping (run, item) pairs"
    )


def stability_text(stability: dict[str, Any], repeats: list) -> str:
    asked = sum(r.judge_requests for r in repeats)
    out = [
        f"\njudge stability over {stability['repeats']} repeats ({', '.join(stability['judges'])}); "
        f"requests in repeats 2..N: {asked}",
        agreement_text(stability),
        "spread across repeats (max range / mean SD): "
        + "; ".join(
            f"{f.upper()} {cell(v['max_range'])} / {cell(v['mean_sd'])}"
            for f, v in stability["spread"]["summary"].items()
        ),
    ]
    return "\n".join(out)


@click.group()
def judge() -> None:
    """Measure judges: agreement between two judges on the same runs."""


@judge.command("compare")
@store_option
@click.option("--a", "judge_a", required=True, help="A judge label in the ledger (e.g. offline:rules-v1).")
@click.option("--b", "judge_b", required=True, help="Another judge label (e.g. llm:<model>).")
@click.option(
    "--profile", default=None, help="Profile whose current rows are compared (default paper-2026-06)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def judge_compare(store: str, judge_a: str, judge_b: str, profile: str | None, as_json: bool) -> None:
    """Per rubric item: agreement, Krippendorff's alpha and flipping runs between judges A and B."""
    from scorer import judge_stability

    loaded = load_profile(profile)
    [rows] = ledger.current_rows(store, loaded)
    labels = sorted({r["judge"] for r in rows})
    for j in (judge_a, judge_b):
        if j not in labels:
            raise UsageError(
                f"no rows from judge {j!r} under profile {loaded.name} (have: {', '.join(labels) or 'none'})"
            )
    a = [r for r in rows if r["judge"] == judge_a]
    b = [r for r in rows if r["judge"] == judge_b]
    common = {r["run_id"] for r in a} & {r["run_id"] for r in b}
    data = judge_stability.agreement_table(
        [[r for r in a if r["run_id"] in common], [r for r in b if r["run_id"] in common]]
    )
    data = {"a": judge_a, "b": judge_b, "profile": loaded.name, "runs": len(common), **data}
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"{judge_a} vs {judge_b} under {loaded.name}: {len(common)} runs scored by both")
    click.echo(agreement_text(data))


commands = [judge]
