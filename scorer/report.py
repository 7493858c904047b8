"""The paper's views over the ledger: as data (``build``), terminal tables, JSON and one HTML page.

Views (scores ×100 as in the paper; unscored values are left out of means and counted as ``n``):
leaderboard per model; medal tiers and ratings per model; OVERALL per model × track; AGENTIC by
tier with Δ = (LITE − STANDARD) / STANDARD; stage means; error-code shares and mean OVERALL by
number of fired codes; recovery rate (runs with ≥ 2 codes that still completed); cost and tokens
per run, and the cost–score and tokens–score Pearson r per track (where a cost is unknown, a model
missing from the price table, the tokens still stand and a view says why); and, when the ledger
holds repeats of a judge, its stability.

The HTML page is ``scorer.report_html``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any, get_args

from schemas.score_row import Medal, Rating
from scorer.judge.parse import CODES

STAGE_KEYS = ("s1", "s2", "s3", "s4", "s5")


COLUMNS = (
    *("run_id", "judge", "profile_id", "profile_name", "model", "task", "track", "tier", "status"),
    *("overall", "agentic", "task_score", *STAGE_KEYS, "cost_usd", "tokens_in", "tokens_out", "turns"),
    *("medal", "rating", "codes", "reasons"),
)
"""The score columns the views, the page's table of runs and the scanners' shares read."""


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _x100(v: float | None) -> float | None:
    return None if v is None else round(100 * v, 1)


def pearson(xs: list[float], ys: list[float]) -> float | None:
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / math.sqrt(sxx * syy)


_cost = itemgetter("cost_usd")


def _tokens(r: dict[str, Any]) -> int | None:
    """Input plus output tokens of a row (None when the row has no token counts)."""
    tin, tout = r.get("tokens_in"), r.get("tokens_out")
    return None if tin is None and tout is None else (tin or 0) + (tout or 0)


def _cost_unknown(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model whose cost is unknown for some runs: how many runs, and why (the scorer's reason)."""
    why: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        if r.get("cost_usd") is None:
            reason = (r.get("reasons") or {}).get("cost") or "no cost was recorded for this run"
            why[r["model"] or "(unknown)"][reason] += 1
    return [{"model": m, "runs": sum(why[m].values()), "why": "; ".join(sorted(why[m]))} for m in sorted(why)]


class _Rows:
    """The ledger rows grouped as the views read them: per model (best OVERALL first) and per track."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.all = rows
        self.by_model: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            self.by_model[r["model"] or "(unknown)"].append(r)
        self.models = sorted(
            self.by_model, key=lambda m: -(_mean(r["overall"] for r in self.by_model[m]) or -1)
        )
        self.tracks = sorted({_track(r) for r in rows})

    def of(self, model: str) -> list[dict[str, Any]]:
        """A model's rows; every row for ``(all)``."""
        return self.all if model == "(all)" else self.by_model[model]


def _track(r: dict[str, Any]) -> str:
    return r["track"] or "(unknown)"


def _leaderboard(g: _Rows) -> list[dict[str, Any]]:
    return [
        {
            "model": m,
            "runs": len(rs),
            "scored": sum(1 for r in rs if r["overall"] is not None),
            "overall": _x100(_mean(r["overall"] for r in rs)),
            "agentic": _x100(_mean(r["agentic"] for r in rs)),
            "task": _x100(_mean(r["task_score"] for r in rs)),
            "cost_per_run": _cost_per_run([r["cost_usd"] for r in rs]),
            "tokens_per_run": rounded(_mean(_tokens(r) for r in rs), 0),
            "turns": rounded(_mean(r["turns"] for r in rs), 1),
            "breaches": sum(1 for r in rs if r["status"] == "breach"),
        }
        for m in g.models
        for rs in [g.by_model[m]]
    ]


def _medals(g: _Rows) -> list[dict[str, Any]]:
    out = []
    for m in g.models + ["(all)"]:
        rs = g.of(m)
        medal_n = Counter(r.get("medal") for r in rs)
        rating_n = Counter(r.get("rating") for r in rs)
        out.append(
            {
                "model": m,
                "runs": len(rs),
                **{k: medal_n.get(k, 0) for k in get_args(Medal)},
                **{k: rating_n.get(k, 0) for k in get_args(Rating)},
                "unrated": rating_n.get(None, 0),
                "resolved_pct": round(100 * (rating_n["A"] + rating_n["B"]) / len(rs), 1) if rs else None,
            }
        )
    return out


def _per_track(g: _Rows) -> list[dict[str, Any]]:
    return [
        {
            "model": m,
            **{t: _x100(_mean(r["overall"] for r in g.by_model[m] if _track(r) == t)) for t in g.tracks},
        }
        for m in g.models
    ]


def _tiers(g: _Rows) -> list[dict[str, Any]]:
    out = []
    for m in g.models:
        lite = _mean(r["agentic"] for r in g.by_model[m] if r["tier"] == "lite")
        std = _mean(r["agentic"] for r in g.by_model[m] if r["tier"] == "standard")
        delta = None if lite is None or not std else round(100 * (lite - std) / std, 1)
        out.append({"model": m, "standard": _x100(std), "lite": _x100(lite), "delta_pct": delta})
    return out


def _stage_means(g: _Rows) -> list[dict[str, Any]]:
    return [
        {"model": m, **{s.upper(): _x100(_mean(r[s] for r in g.of(m))) for s in STAGE_KEYS}}
        for m in g.models + ["(all)"]
    ]


def _code_shares(g: _Rows) -> list[dict[str, Any]]:
    tags = Counter(c for r in g.all for c in (r["codes"] or []))
    total = sum(tags.values())
    return [
        {"code": c, "count": tags[c], "share_pct": round(100 * tags[c] / total, 1) if total else None}
        for c in CODES
    ]


def _overall_by_code_count(g: _Rows) -> list[dict[str, Any]]:
    by_n: dict[str, list[dict]] = defaultdict(list)
    for r in g.all:
        n = len(r["codes"] or [])
        by_n[str(n) if n < 3 else "3+"].append(r)
    return [
        {"codes": k, "runs": len(by_n[k]), "overall": _x100(_mean(r["overall"] for r in by_n[k]))}
        for k in ("0", "1", "2", "3+")
        if by_n.get(k)
    ]


def _recovery(g: _Rows) -> list[dict[str, Any]]:
    out = []
    for m in g.models + ["(all)"]:
        multi = [r for r in g.of(m) if len(r["codes"] or []) >= 2]
        done = sum(1 for r in multi if r["status"] == "completed")
        pct = round(100 * done / len(multi), 1) if multi else None
        out.append({"model": m, "runs_2plus_codes": len(multi), "completed": done, "recovery_pct": pct})
    return out


def _cost_correlation(g: _Rows) -> list[dict[str, Any]]:
    out = []
    for t in g.tracks:
        pts, tok_pts = _points(g.all, t, _cost), _points(g.all, t, _tokens)
        mine = [r for r in g.all if _track(r) == t]
        out.append(
            {
                "track": t,
                "points": len(pts),
                "pearson_r": rounded(pearson([p[0] for p in pts], [p[1] for p in pts]), 3),
                "cost_per_run": _cost_per_run([r["cost_usd"] for r in mine]),
                "tokens_per_run": rounded(_mean(_tokens(r) for r in mine), 0),
                "pearson_r_tokens": rounded(
                    pearson([float(p[0]) for p in tok_pts], [p[1] for p in tok_pts]), 3
                ),
            }
        )
    return out


VIEWS: tuple[tuple[str, Callable[[_Rows], Any]], ...] = (
    ("leaderboard", _leaderboard),
    ("medals", _medals),
    ("per_track", _per_track),
    ("tracks", lambda g: g.tracks),
    ("tiers", _tiers),
    ("stage_means", _stage_means),
    ("code_shares", _code_shares),
    ("overall_by_code_count", _overall_by_code_count),
    ("recovery", _recovery),
    ("cost_correlation", _cost_correlation),
    ("cost_unknown", lambda g: _cost_unknown(g.all)),
    ("scatter_tokens", lambda g: {t: _points(g.all, t, _tokens) for t in g.tracks}),
    ("scatter", lambda g: {t: _points(g.all, t, _cost) for t in g.tracks}),
)
"""The report's views in the order ``build`` returns them."""


def build(rows: list[dict[str, Any]]) -> dict[str, Any]:
    g = _Rows(rows)
    judges = sorted({r["judge"] for r in rows})
    profiles = sorted({f"{r['profile_name']} ({r['profile_id'][7:19]})" for r in rows})
    return {"runs": len(rows), "judges": judges, "profiles": profiles, **{k: view(g) for k, view in VIEWS}}


def _points(rows: list[dict[str, Any]], track: str, x: Callable[[dict], Any]) -> list[tuple[float, float]]:
    """(x, OVERALL) of the track's runs that have both."""
    return [
        (float(v), r["overall"])
        for r in rows
        if _track(r) == track and (v := x(r)) is not None and r["overall"] is not None
    ]


def rounded(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


def _cost_per_run(costs: list[float | None]) -> float | None:
    """The mean cost of these runs; unknown (None) when any of their costs is: a mean over the
    priced runs alone would pass for all of them. Three significant digits, so that a cheap run's
    cost is not rounded to 0."""
    if not costs or any(c is None for c in costs):
        return None
    return float(f"{_mean(costs):.3g}")


SECTIONS = (
    ("Leaderboard per model (×100)", "leaderboard"),
    ("Medal tiers and ratings per model (resolved = rating A or B)", "medals"),
    ("OVERALL per model and track (×100)", "per_track"),
    ("AGENTIC by tier, Δ = (LITE − STANDARD) / STANDARD", "tiers"),
    ("Stage means (×100)", "stage_means"),
    ("Error-code shares (of all fired tags)", "code_shares"),
    ("OVERALL by number of fired codes (×100)", "overall_by_code_count"),
    ("Recovery rate (runs with ≥ 2 codes that completed)", "recovery"),
    ("Cost and tokens per run, and their Pearson r with OVERALL, per track", "cost_correlation"),
    ("Why a cost is unknown", "cost_unknown"),
)


def cell(v: Any, column: str = "") -> str:
    if v is None:
        return "unknown" if column.startswith("cost") else "—"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def terminal(report: dict[str, Any], render) -> str:
    """All views as aligned text tables; ``render(columns, rows)`` draws one table."""
    out = [
        f"{report['runs']} runs; judge: {', '.join(report['judges']) or '-'}; "
        f"profile: {', '.join(report['profiles']) or '-'}"
    ]
    for title, key in SECTIONS:
        rows = report[key]
        if not rows:
            continue
        cols = list(rows[0].keys())
        out.append("")
        out.append(title)
        out.append(render(cols, [[cell(r.get(c), c) for c in cols] for r in rows]))
    return "\n".join(out)
