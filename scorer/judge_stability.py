"""How stable a judge is: the same rubric items asked N times, and two judges on the same runs.

Input is score rows. Only items a judge decided count (``source == "judge"`` with a value):
auto-credited and forced items are rules, not judgements. For each rubric item, a *unit* is one run;
its values are the item's values across the repeats (or across the two judges). Reported: pairwise
agreement, Krippendorff's nominal alpha (Krippendorff 2011; None when every value is the same),
flips (units whose values differ), and per run the spread of S1, S2, S3 and AGENTIC.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

SPREAD_FIELDS = ("s1", "s2", "s3", "agentic")


def judged_values(row: dict[str, Any]) -> dict[str, float]:
    """item id -> value for the items the judge decided in one row."""
    items = (row.get("details") or {}).get("items", [])
    return {
        i["id"]: float(i["value"]) for i in items if i.get("source") == "judge" and i.get("value") is not None
    }


def krippendorff_alpha_nominal(units: Iterable[Sequence[float]]) -> float | None:
    """Nominal alpha over units of values (each unit: the values its coders gave; missing left out)."""
    o: defaultdict[tuple[float, float], float] = defaultdict(float)
    for values in units:
        m = len(values)
        if m < 2:
            continue
        for i, a in enumerate(values):
            for j, b in enumerate(values):
                if i != j:
                    o[(a, b)] += 1.0 / (m - 1)
    n_c: defaultdict[float, float] = defaultdict(float)
    for (a, _b), w in o.items():
        n_c[a] += w
    n = sum(n_c.values())
    if n <= 1:
        return None
    observed = sum(w for (a, b), w in o.items() if a != b)
    expected = sum(n_c[a] * n_c[b] for a in n_c for b in n_c if a != b)
    if expected == 0:
        return None
    return 1.0 - (n - 1) * observed / expected


def pair_agreement(values: Sequence[float]) -> float | None:
    m = len(values)
    if m < 2:
        return None
    pairs = m * (m - 1) / 2
    same = sum(1 for i in range(m) for j in range(i + 1, m) if values[i] == values[j])
    return same / pairs


def _units(rows_by_coder: Sequence[Sequence[dict[str, Any]]]) -> dict[str, dict[str, list[float]]]:
    """item -> run -> the values of that item in that run, one per coder that decided it."""
    per_coder = [{r["run_id"]: judged_values(r) for r in rows} for rows in rows_by_coder]
    units: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for run in sorted(set().union(*per_coder)):
        for coder in per_coder:
            for item, value in coder.get(run, {}).items():
                units[item].setdefault(run, []).append(value)
    return units


def agreement_table(rows_by_coder: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """Per item and overall: units, agreement, alpha and the flipping runs."""
    units = _units(rows_by_coder)
    items = []
    all_units: list[list[float]] = []
    for item, by_run in sorted(units.items()):
        pairable = {run: v for run, v in by_run.items() if len(v) >= 2}
        agree = [pair_agreement(v) for v in pairable.values()]
        flips = sorted(run for run, v in pairable.items() if len(set(v)) > 1)
        alpha = krippendorff_alpha_nominal(pairable.values())
        all_units.extend(pairable.values())
        row = {"item": item, "units": len(pairable), "agreement": _mean(a for a in agree if a is not None)}
        items.append(row | {"alpha": alpha, "flips": len(flips), "flipping_runs": flips})
    agree_all = [pair_agreement(v) for v in all_units]
    return {
        "coders": len(rows_by_coder),
        "items": items,
        "overall": {
            "units": len(all_units),
            "agreement": _mean(a for a in agree_all if a is not None),
            "alpha": krippendorff_alpha_nominal(all_units),
            "flips": sum(i["flips"] for i in items),
        },
    }


def spread(rows_by_repeat: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """Per run and over runs: how much S1–S3 and AGENTIC move between repeats."""
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rows in rows_by_repeat:
        for r in rows:
            by_run[r["run_id"]].append(r)
    runs = []
    for run, rs in sorted(by_run.items()):
        entry: dict[str, Any] = {"run_id": run}
        for f in SPREAD_FIELDS:
            vals = [r[f] for r in rs if r.get(f) is not None]
            entry[f"{f}_range"] = (max(vals) - min(vals)) if len(vals) >= 2 else None
            entry[f"{f}_sd"] = _sd(vals)
        runs.append(entry)
    summary = {}
    for f in SPREAD_FIELDS:
        ranges = [e[f"{f}_range"] for e in runs if e[f"{f}_range"] is not None]
        summary[f] = {
            "max_range": max(ranges) if ranges else None,
            "mean_sd": _mean(e[f"{f}_sd"] for e in runs if e[f"{f}_sd"] is not None),
        }
    return {"runs": runs, "summary": summary}


def _mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def _sd(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))
