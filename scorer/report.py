"""The paper's views over the ledger: as data (``build``), terminal tables and JSON.

Scores are ×100 as in the paper; unscored values are left out of means. Where a cost is unknown (a
model missing from the price table) the tokens still stand and a view says why. The HTML page is
``scorer.report_html``.
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


def x100(v: float | None) -> float | None:
    return None if v is None else round(100 * v, 1)


def percent(part: float, whole: float) -> float | None:
    return round(100 * part / whole, 1) if whole else None


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


def _tokens(r: dict[str, Any]) -> int | None:
    """Input plus output tokens of a row (None when the row has no token counts)."""
    tin, tout = r.get("tokens_in"), r.get("tokens_out")
    return None if tin is None and tout is None else (tin or 0) + (tout or 0)


class _Mean:
    """A running mean that leaves unscored (None) values out. The total is exact (Shewchuk's
    partials, rounded once at the end as ``math.fsum`` does), so the mean does not depend on the
    order the rows come in."""

    __slots__ = ("n", "partials")

    def __init__(self) -> None:
        self.n = 0
        self.partials: list[float] = []

    def add(self, v: float | None) -> None:
        if v is None:
            return
        self.n += 1
        x, i = float(v), 0
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                self.partials[i] = lo
                i += 1
            x = hi
        self.partials[i:] = [x]

    @property
    def value(self) -> float | None:
        return math.fsum(self.partials) / self.n if self.n else None


MEANS = ("overall", "agentic", "task_score", *STAGE_KEYS, "turns", "tokens", "cost_usd")
"""The row values whose means the views show (of a model's runs, and of all runs)."""

_GROUP_MEANS = {
    "track": ("tokens", "cost_usd"),
    "model_track": ("overall",),
    "model_tier": ("agentic",),
    "codes": ("overall",),
}
"""The means the views show of the other groups' runs (per track, per model and track, ...)."""


class _Stats:
    """Running totals over a group of runs (a model's, a track's, everyone's): what the views read of
    them, without holding the runs."""

    def __init__(self, means: tuple[str, ...] = MEANS) -> None:
        self.runs = self.scored = self.breaches = self.multi = self.recovered = 0
        self.cost_unknown = False
        self.means = {k: _Mean() for k in means}
        self.medals: Counter = Counter()
        self.ratings: Counter = Counter()

    def add(self, r: dict[str, Any], tokens: int | None, n_codes: int) -> None:
        self.runs += 1
        self.scored += r["overall"] is not None
        self.breaches += r["status"] == "breach"
        self.cost_unknown = self.cost_unknown or r["cost_usd"] is None
        for k, m in self.means.items():
            m.add(tokens if k == "tokens" else r[k])
        self.medals[r.get("medal")] += 1
        self.ratings[r.get("rating")] += 1
        if n_codes >= 2:
            self.multi += 1
            self.recovered += r["status"] == "completed"

    def mean(self, key: str) -> float | None:
        return self.means[key].value

    def cost_per_run(self) -> float | None:
        """The mean cost of these runs; unknown (None) when any of their costs is: a mean over the
        priced runs alone would pass for all of them. Three significant digits, so that a cheap
        run's cost is not rounded to 0."""
        cost = self.mean("cost_usd")
        return None if self.cost_unknown or cost is None else float(f"{cost:.3g}")


class _Tally:
    """The ledger rows folded as the views read them, one row at a time, in any order (the rows can
    be a stream of any length): per model (best OVERALL first, then the model whose first run comes
    first), per track, per model and track or tier, per number of fired codes, and each track's
    (cost, OVERALL) and (tokens, OVERALL) points in run order."""

    def __init__(self, rows: Iterable[dict[str, Any]]):
        self.all = _Stats()
        self.by_model: dict[str, _Stats] = {}
        self.first_run: dict[str, str] = {}
        self.by: dict[tuple[str, ...], _Stats] = {}
        self.codes: Counter = Counter()
        self.why_unknown: dict[str, Counter] = defaultdict(Counter)
        points: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
        token_points: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
        self._points = (points, token_points)
        self.judges: set[str] = set()
        self.profiles: set[str] = set()
        for r in rows:
            self._add(r)
        self.models = sorted(
            self.by_model, key=lambda m: (-(self.by_model[m].mean("overall") or -1), self.first_run[m])
        )
        self.points, self.token_points = (_in_run_order(p) for p in self._points)
        self.tracks = sorted(k[1] for k in self.by if k[0] == "track")

    def _add(self, r: dict[str, Any]) -> None:
        model, track = r["model"] or "(unknown)", r["track"] or "(unknown)"
        tokens, run = _tokens(r), r.get("run_id") or ""
        self.first_run[model] = min(self.first_run.get(model, run), run)
        codes = r["codes"] or []
        if model not in self.by_model:
            self.by_model[model] = _Stats()
        keys = [("track", track), ("model_track", model, track), ("model_tier", model, r["tier"])]
        keys.append(("codes", str(len(codes)) if len(codes) < 3 else "3+"))
        for key in keys:
            if key not in self.by:
                self.by[key] = _Stats(_GROUP_MEANS[key[0]])
        for g in [self.all, self.by_model[model], *(self.by[k] for k in keys)]:
            g.add(r, tokens, len(codes))
        self.codes.update(codes)
        if r["cost_usd"] is None:
            reason = (r.get("reasons") or {}).get("cost") or "no cost was recorded for this run"
            self.why_unknown[model][reason] += 1
        if r["overall"] is not None:
            if r["cost_usd"] is not None:
                self._points[0][track].append((run, float(r["cost_usd"]), r["overall"]))
            if tokens is not None:
                self._points[1][track].append((run, float(tokens), r["overall"]))
        self.judges.add(r["judge"])
        self.profiles.add(f"{r['profile_name']} ({r['profile_id'][7:19]})")

    def of(self, model: str) -> _Stats:
        """A model's totals; everyone's for ``(all)``."""
        return self.all if model == "(all)" else self.by_model[model]

    def get(self, *key: str) -> _Stats:
        """The totals of one group (empty when no run is in it), without adding the group."""
        return self.by.get(key) or _Stats()


def _in_run_order(points: dict[str, list[tuple[str, float, float]]]) -> dict[str, list[tuple[float, float]]]:
    """Each track's (run, x, y) points as (x, y), in run order."""
    return defaultdict(
        list, {t: [(x, y) for _, x, y in sorted(p, key=itemgetter(0))] for t, p in points.items()}
    )


def _leaderboard(g: _Tally) -> list[dict[str, Any]]:
    return [
        {
            "model": m,
            "runs": s.runs,
            "scored": s.scored,
            "overall": x100(s.mean("overall")),
            "agentic": x100(s.mean("agentic")),
            "task": x100(s.mean("task_score")),
            "cost_per_run": s.cost_per_run(),
            "tokens_per_run": rounded(s.mean("tokens"), 0),
            "turns": rounded(s.mean("turns"), 1),
            "breaches": s.breaches,
        }
        for m in g.models
        for s in [g.by_model[m]]
    ]


def _medals(g: _Tally) -> list[dict[str, Any]]:
    return [
        {
            "model": m,
            "runs": s.runs,
            **{k: s.medals.get(k, 0) for k in get_args(Medal)},
            **{k: s.ratings.get(k, 0) for k in get_args(Rating)},
            "unrated": s.ratings.get(None, 0),
            "resolved_pct": percent(s.ratings["A"] + s.ratings["B"], s.runs),
        }
        for m in g.models + ["(all)"]
        for s in [g.of(m)]
    ]


def _per_track(g: _Tally) -> list[dict[str, Any]]:
    return [
        {"model": m, **{t: x100(g.get("model_track", m, t).mean("overall")) for t in g.tracks}}
        for m in g.models
    ]


def _tiers(g: _Tally) -> list[dict[str, Any]]:
    out = []
    for m in g.models:
        lite = g.get("model_tier", m, "lite").mean("agentic")
        std = g.get("model_tier", m, "standard").mean("agentic")
        delta = None if lite is None or not std else round(100 * (lite - std) / std, 1)
        out.append({"model": m, "standard": x100(std), "lite": x100(lite), "delta_pct": delta})
    return out


def _stage_means(g: _Tally) -> list[dict[str, Any]]:
    return [
        {"model": m, **{s.upper(): x100(g.of(m).mean(s)) for s in STAGE_KEYS}} for m in g.models + ["(all)"]
    ]


def _code_shares(g: _Tally) -> list[dict[str, Any]]:
    total = sum(g.codes.values())
    return [{"code": c, "count": g.codes[c], "share_pct": percent(g.codes[c], total)} for c in CODES]


def _overall_by_code_count(g: _Tally) -> list[dict[str, Any]]:
    return [
        {"codes": k, "runs": s.runs, "overall": x100(s.mean("overall"))}
        for k in ("0", "1", "2", "3+")
        if (s := g.get("codes", k)).runs
    ]


def _recovery(g: _Tally) -> list[dict[str, Any]]:
    out = []
    for m in g.models + ["(all)"]:
        s = g.of(m)
        pct = percent(s.recovered, s.multi)
        out.append({"model": m, "runs_2plus_codes": s.multi, "completed": s.recovered, "recovery_pct": pct})
    return out


def _cost_correlation(g: _Tally) -> list[dict[str, Any]]:
    return [
        {
            "track": t,
            "points": len(pts),
            "pearson_r": rounded(pearson([x for x, _ in pts], [y for _, y in pts]), 3),
            "cost_per_run": s.cost_per_run(),
            "tokens_per_run": rounded(s.mean("tokens"), 0),
            "pearson_r_tokens": rounded(pearson([x for x, _ in tok], [y for _, y in tok]), 3),
        }
        for t in g.tracks
        for pts, tok, s in [(g.points[t], g.token_points[t], g.get("track", t))]
    ]


def _cost_unknown(g: _Tally) -> list[dict[str, Any]]:
    """Per model whose cost is unknown for some runs: how many runs, and why (the scorer's reason)."""
    why = g.why_unknown
    return [{"model": m, "runs": sum(why[m].values()), "why": "; ".join(sorted(why[m]))} for m in sorted(why)]


VIEWS: tuple[tuple[str, Callable[[_Tally], Any]], ...] = (
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
    ("cost_unknown", _cost_unknown),
    ("scatter_tokens", lambda g: {t: g.token_points[t] for t in g.tracks}),
    ("scatter", lambda g: {t: g.points[t] for t in g.tracks}),
)
"""The report's views in the order ``build`` returns them."""


def build(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The views of these rows (read once, in order: a stream of any length is folded into running
    totals, so that only the scatter plots' points grow with the number of runs)."""
    g = _Tally(rows)
    head = {"runs": g.all.runs, "judges": sorted(g.judges), "profiles": sorted(g.profiles)}
    return {**head, **{k: view(g) for k, view in VIEWS}}


def rounded(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


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
