"""The paper's views over the ledger: as data (``build``), terminal tables, JSON and one HTML page.

Views (scores ×100 as in the paper; unscored values are left out of means and counted as ``n``):
leaderboard per model; medal tiers and ratings per model; OVERALL per model × track; AGENTIC by
tier with Δ = (LITE − STANDARD) / STANDARD; stage means; error-code shares and mean OVERALL by
number of fired codes; recovery rate (runs with ≥ 2 codes that still completed); cost and tokens
per run, and the cost–score and tokens–score Pearson r per track (where a cost is unknown, a model
missing from the price table, the tokens still stand and a view says why); and, when the ledger
holds repeats of a judge, its stability.

The HTML page is self-contained: inline CSS and inline SVG plots drawn here, no scripts, no network.
"""

from __future__ import annotations

import html
import math
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

STAGE_KEYS = ("s1", "s2", "s3", "s4", "s5")
CODES = ("E1", "E2", "E3", "E4", "E5")
MEDALS = ("good", "okay", "fail")
RATINGS = ("A", "B", "C", "F")


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


def build(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_model[r["model"] or "(unknown)"].append(r)
    models = sorted(by_model, key=lambda m: -(_mean(r["overall"] for r in by_model[m]) or -1))
    tracks = sorted({r["track"] or "(unknown)" for r in rows})

    leaderboard = []
    for m in models:
        rs = by_model[m]
        leaderboard.append(
            {
                "model": m,
                "runs": len(rs),
                "scored": sum(1 for r in rs if r["overall"] is not None),
                "overall": _x100(_mean(r["overall"] for r in rs)),
                "agentic": _x100(_mean(r["agentic"] for r in rs)),
                "task": _x100(_mean(r["task_score"] for r in rs)),
                "cost_per_run": _cost_per_run([r["cost_usd"] for r in rs]),
                "tokens_per_run": _round(_mean(_tokens(r) for r in rs), 0),
                "turns": _round(_mean(r["turns"] for r in rs), 1),
                "breaches": sum(1 for r in rs if r["status"] == "breach"),
            }
        )
    per_track = [
        {
            "model": m,
            **{
                t: _x100(_mean(r["overall"] for r in by_model[m] if (r["track"] or "(unknown)") == t))
                for t in tracks
            },
        }
        for m in models
    ]
    tiers = []
    for m in models:
        lite = _mean(r["agentic"] for r in by_model[m] if r["tier"] == "lite")
        std = _mean(r["agentic"] for r in by_model[m] if r["tier"] == "standard")
        delta = None if lite is None or not std else round(100 * (lite - std) / std, 1)
        tiers.append({"model": m, "standard": _x100(std), "lite": _x100(lite), "delta_pct": delta})
    stage_means = [
        {"model": m, **{s.upper(): _x100(_mean(r[s] for r in by_model[m])) for s in STAGE_KEYS}}
        for m in models
    ]
    stage_means.append(
        {"model": "(all)", **{s.upper(): _x100(_mean(r[s] for r in rows)) for s in STAGE_KEYS}}
    )

    tags = Counter(c for r in rows for c in (r["codes"] or []))
    total_tags = sum(tags.values())
    code_shares = [
        {
            "code": c,
            "count": tags[c],
            "share_pct": round(100 * tags[c] / total_tags, 1) if total_tags else None,
        }
        for c in CODES
    ]
    by_n: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        n = len(r["codes"] or [])
        by_n[str(n) if n < 3 else "3+"].append(r)
    by_count = [
        {"codes": k, "runs": len(by_n[k]), "overall": _x100(_mean(r["overall"] for r in by_n[k]))}
        for k in ("0", "1", "2", "3+")
        if by_n.get(k)
    ]
    recovery = []
    for m in models + ["(all)"]:
        rs = rows if m == "(all)" else by_model[m]
        multi = [r for r in rs if len(r["codes"] or []) >= 2]
        done = sum(1 for r in multi if r["status"] == "completed")
        recovery.append(
            {
                "model": m,
                "runs_2plus_codes": len(multi),
                "completed": done,
                "recovery_pct": round(100 * done / len(multi), 1) if multi else None,
            }
        )
    cost_corr = []
    for t in tracks:
        pts = [
            (r["cost_usd"], r["overall"])
            for r in rows
            if (r["track"] or "(unknown)") == t and r["cost_usd"] is not None and r["overall"] is not None
        ]
        r_ = pearson([p[0] for p in pts], [p[1] for p in pts])
        tok_pts = _token_points(rows, t)
        cost_corr.append(
            {
                "track": t,
                "points": len(pts),
                "pearson_r": _round(r_, 3),
                "cost_per_run": _cost_per_run(
                    [r["cost_usd"] for r in rows if (r["track"] or "(unknown)") == t]
                ),
                "tokens_per_run": _round(
                    _mean(_tokens(r) for r in rows if (r["track"] or "(unknown)") == t), 0
                ),
                "pearson_r_tokens": _round(
                    pearson([float(p[0]) for p in tok_pts], [p[1] for p in tok_pts]), 3
                ),
            }
        )
    medals = []
    for m in models + ["(all)"]:
        rs = rows if m == "(all)" else by_model[m]
        medal_n = Counter(r.get("medal") for r in rs)
        rating_n = Counter(r.get("rating") for r in rs)
        medals.append(
            {
                "model": m,
                "runs": len(rs),
                **{k: medal_n.get(k, 0) for k in MEDALS},
                **{k: rating_n.get(k, 0) for k in RATINGS},
                "unrated": rating_n.get(None, 0),
                "resolved_pct": round(100 * (rating_n["A"] + rating_n["B"]) / len(rs), 1) if rs else None,
            }
        )
    judges = sorted({r["judge"] for r in rows})
    profiles = sorted({f"{r['profile_name']} ({r['profile_id'][7:19]})" for r in rows})
    return {
        "runs": len(rows),
        "judges": judges,
        "profiles": profiles,
        "leaderboard": leaderboard,
        "medals": medals,
        "per_track": per_track,
        "tracks": tracks,
        "tiers": tiers,
        "stage_means": stage_means,
        "code_shares": code_shares,
        "overall_by_code_count": by_count,
        "recovery": recovery,
        "cost_correlation": cost_corr,
        "cost_unknown": _cost_unknown(rows),
        "scatter_tokens": {t: _token_points(rows, t) for t in tracks},
        "scatter": {
            t: [
                (r["cost_usd"], r["overall"])
                for r in rows
                if (r["track"] or "(unknown)") == t and r["cost_usd"] is not None and r["overall"] is not None
            ]
            for t in tracks
        },
    }


def _token_points(rows: list[dict[str, Any]], track: str) -> list[tuple[float, float]]:
    return [
        (float(tok), r["overall"])
        for r in rows
        if (r["track"] or "(unknown)") == track
        and (tok := _tokens(r)) is not None
        and r["overall"] is not None
    ]


def _round(v: float | None, nd: int) -> float | None:
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


def _cell(v: Any, column: str = "") -> str:
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
        out.append(render(cols, [[_cell(r.get(c), c) for c in cols] for r in rows]))
    return "\n".join(out)


# ---- HTML -------------------------------------------------------------------------------------

PALETTE = ("#3b6ea5", "#d9822b", "#4e9a5b", "#b5464b", "#7d5ba6", "#8c6d3f", "#c05fa0", "#6b6b6b")


def _svg_bars(title: str, labels: list[str], values: list[float | None], vmax: float = 100.0) -> str:
    w, row_h, left = 640, 26, 190
    h = 40 + row_h * len(labels)
    parts = [
        (
            f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" '
            f'aria-label="{html.escape(title)}">'
        ),
        f'<text x="10" y="20" font-weight="bold">{html.escape(title)}</text>',
    ]
    for i, (lab, v) in enumerate(zip(labels, values, strict=False)):
        y = 32 + i * row_h
        parts.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{html.escape(lab[:28])}</text>')
        if v is None:
            parts.append(f'<text x="{left + 4}" y="{y + 15}" fill="#888">unscored</text>')
            continue
        bw = max(1.0, (w - left - 60) * max(0.0, v) / vmax)
        parts.append(
            f'<rect x="{left}" y="{y + 3}" width="{bw:.1f}" height="{row_h - 8}" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
        )
        parts.append(f'<text x="{left + bw + 6:.1f}" y="{y + 15}">{v:g}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_stages(rows: list[dict[str, Any]]) -> str:
    w, h, left, bottom = 640, 260, 40, 220
    stages = [s.upper() for s in STAGE_KEYS]
    models = [r for r in rows if r["model"] != "(all)"]
    group_w = (w - left - 20) / len(stages)
    bar_w = max(2.0, (group_w - 10) / max(1, len(models)))
    parts = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{w}" '
        f'height="{h + 20 + 16 * len(models)}" role="img" aria-label="Stage means">',
        '<text x="10" y="16" font-weight="bold">Stage means by model (×100)</text>',
        f'<line x1="{left}" y1="{bottom}" x2="{w - 10}" y2="{bottom}" stroke="#444"/>',
    ]
    for gi, s in enumerate(stages):
        gx = left + gi * group_w
        parts.append(f'<text x="{gx + group_w / 2:.1f}" y="{bottom + 16}" text-anchor="middle">{s}</text>')
        for mi, r in enumerate(models):
            v = r.get(s)
            if v is None:
                continue
            bh = (bottom - 30) * v / 100
            parts.append(
                f'<rect x="{gx + 5 + mi * bar_w:.1f}" y="{bottom - bh:.1f}" width="{bar_w - 1:.1f}" '
                f'height="{bh:.1f}" fill="{PALETTE[mi % len(PALETTE)]}">'
                f"<title>{html.escape(r['model'])} {s}: {v:g}</title></rect>"
            )
    for mi, r in enumerate(models):
        y = h + 10 + 16 * mi
        parts.append(
            f'<rect x="{left}" y="{y - 10}" width="10" height="10" fill="{PALETTE[mi % len(PALETTE)]}"/>'
            f'<text x="{left + 16}" y="{y}">{html.escape(r["model"])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _svg_scatter(track: str, pts: list[tuple[float, float]], r: float | None, unit: str = "cost") -> str:
    """OVERALL against cost (``unit="cost"``) or, where costs are unknown, against tokens."""
    w, h, left, bottom = 300, 220, 44, 180
    xmax = max([p[0] for p in pts] + [1e-9])
    top = f"${xmax:.2f}" if unit == "cost" else f"{xmax:,.0f} tokens"
    parts = [
        (
            f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" '
            f'aria-label="{unit.capitalize()} vs OVERALL, {html.escape(track)}">'
        ),
        (
            f'<text x="8" y="16" font-weight="bold">{html.escape(track)}: {unit} vs OVERALL '
            f"(r = {'—' if r is None else f'{r:.2f}'})</text>"
        ),
        (
            f'<line x1="{left}" y1="{bottom}" x2="{w - 10}" y2="{bottom}" stroke="#444"/><line x1="{left}" '
            f'y1="28" x2="{left}" y2="{bottom}" stroke="#444"/>'
        ),
        (
            f'<text x="{w - 10}" y="{bottom + 16}" text-anchor="end">{top}</text>'
            f'<text x="{left - 4}" y="34" text-anchor="end">100</text>'
        ),
    ]
    for x, y in pts:
        px = left + (w - left - 14) * x / xmax
        py = bottom - (bottom - 30) * y
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="#3b6ea5" fill-opacity="0.6"/>')
    parts.append("</svg>")
    return "".join(parts)


def _html_table(rows: list[dict[str, Any]], table_id: str) -> str:
    if not rows:
        return "<p>No rows.</p>"
    cols = list(rows[0].keys())
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c), c))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _stability_html(st: dict[str, Any]) -> str:
    """The judge's stability over its repeats: per-item agreement and alpha, and the spread."""
    items = [
        {
            "item": i["item"],
            "units": i["units"],
            "agreement": _round(i["agreement"], 4),
            "alpha": "no variation" if i["alpha"] is None else round(i["alpha"], 4),
            "flips": i["flips"],
            "flipping runs": ", ".join(i["flipping_runs"][:5]),
        }
        for i in st["items"]
    ]
    o = st["overall"]
    spread = [
        {"score": f.upper(), "max range": _round(v["max_range"], 4), "mean SD": _round(v["mean_sd"], 4)}
        for f, v in st["spread"]["summary"].items()
    ]
    alpha = "no variation" if o["alpha"] is None else f"{o['alpha']:.4f}"
    agree = "—" if o["agreement"] is None else f"{o['agreement']:.4f}"
    return (
        f"<h2>Judge stability over {st['repeats']} repeats</h2>"
        f'<p class="meta">{html.escape(", ".join(st["judges"]))} · {o["units"]} (run, item) units · '
        f"agreement {agree} · Krippendorff's alpha (nominal) {alpha} · {o['flips']} flips</p>"
        + _svg_bars(
            "Agreement per rubric item (%)",
            [i["item"] for i in st["items"]],
            [None if i["agreement"] is None else round(100 * i["agreement"], 1) for i in st["items"]],
        )
        + _html_table(items, "judge_stability")
        + _html_table(spread, "judge_spread")
    )


def _scatter(report: dict[str, Any], corr: dict[str, Any]) -> str:
    """The cost scatter of a track; its tokens scatter where no run of the track has a cost."""
    track = corr["track"]
    cost_pts = report["scatter"].get(track, [])
    if cost_pts:
        return _svg_scatter(track, cost_pts, corr["pearson_r"])
    return _svg_scatter(
        track, report.get("scatter_tokens", {}).get(track, []), corr.get("pearson_r_tokens"), "tokens"
    )


def _runs_section(runs: list[dict[str, Any]], viewer_url: str | None) -> str:
    """Every run with its scores; with ``viewer_url``, each run id links into ``amb serve``."""
    base = viewer_url.rstrip("/") if viewer_url else None
    body = []
    for r in sorted(runs, key=lambda r: (r.get("task") or "", r.get("model") or "", r["run_id"])):
        rid = html.escape(r["run_id"])
        if base:
            href = html.escape(f"{base}/runs/{urllib.parse.quote(r['run_id'], safe='')}", quote=True)
            rid = f'<a href="{href}">{rid}</a>'
        cells = [
            r.get("task"),
            r.get("tier"),
            r.get("model"),
            r.get("status"),
            _round(None if r.get("overall") is None else 100 * r["overall"], 1),
            " ".join(r.get("codes") or []),
        ]
        body.append(
            f"<tr><td>{rid}</td>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in cells) + "</tr>"
        )
    head = "".join(f"<th>{h}</th>" for h in ("run", "task", "tier", "model", "status", "OVERALL", "codes"))
    note = (
        f'<p class="meta">Run ids open the run in the viewer at {html.escape(base)} '
        "(start it with <code>amb serve</code>).</p>"
        if base
        else ""
    )
    table = f'<table id="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    return f"<h2>Runs</h2>{note}{table}"


def html_page(
    report: dict[str, Any],
    title: str = "AMB score report",
    runs: list[dict[str, Any]] | None = None,
    viewer_url: str | None = None,
) -> str:
    lb = report["leaderboard"]
    plots = [
        _svg_bars("OVERALL per model (×100)", [r["model"] for r in lb], [r["overall"] for r in lb]),
        _svg_stages(report["stage_means"]),
    ]
    scatters = "".join(_scatter(report, c) for c in report["cost_correlation"])
    sections = []
    for name, key in SECTIONS:
        if key == "cost_unknown" and not report[key]:
            continue
        sections.append(f"<h2>{html.escape(name)}</h2>{_html_table(report[key], key)}")
        if key == "leaderboard":
            sections.append(plots[0])
        if key == "stage_means":
            sections.append(plots[1])
        if key == "medals" and report["medals"]:
            everyone = report["medals"][-1]
            sections.append(
                _svg_bars(
                    "Ratings, all runs (% of runs)",
                    [*RATINGS, "unrated"],
                    [
                        round(100 * everyone[k] / everyone["runs"], 1) if everyone["runs"] else None
                        for k in (*RATINGS, "unrated")
                    ],
                )
            )
        if key == "code_shares":
            sections.append(
                _svg_bars(
                    "Share of fired error codes (%)",
                    [c["code"] for c in report["code_shares"]],
                    [c["share_pct"] for c in report["code_shares"]],
                )
            )
        if key == "overall_by_code_count" and report["overall_by_code_count"]:
            sections.append(
                _svg_bars(
                    "OVERALL by number of codes (×100)",
                    [f"{c['codes']} codes" for c in report["overall_by_code_count"]],
                    [c["overall"] for c in report["overall_by_code_count"]],
                )
            )
        if key == "cost_correlation" and scatters:
            sections.append(f'<div class="row">{scatters}</div>')
    stability = report.get("judge_stability")
    if stability:
        sections.append(_stability_html(stability))
    if runs:
        sections.append(_runs_section(runs, viewer_url))
    meta = (
        f"{report['runs']} runs · judge: {html.escape(', '.join(report['judges']) or '-')} · "
        f"profile: {html.escape(', '.join(report['profiles']) or '-')}"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f0f0f0; }} td:first-child, th:first-child {{ text-align: left; }}
svg.plot {{ font: 12px system-ui, sans-serif; margin: 6px 12px 6px 0; background: #fafafa;
           border: 1px solid #eee; }}
.row {{ display: flex; flex-wrap: wrap; }} .meta {{ color: #666; }}
</style></head>
<body><h1>{html.escape(title)}</h1><p class="meta">{meta}</p>
{"".join(sections)}
</body></html>
"""
