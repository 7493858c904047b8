"""The report as one self-contained HTML page: inline CSS and inline SVG plots drawn here, no scripts,
no network. Its tables are the views of ``scorer.report.build``."""

from __future__ import annotations

import html
import urllib.parse
from typing import Any, get_args

from schemas.score_row import Rating
from scorer.report import SECTIONS, STAGE_KEYS, cell, percent, rounded, x100

PALETTE = ("#3b6ea5", "#d9822b", "#4e9a5b", "#b5464b", "#7d5ba6", "#8c6d3f", "#c05fa0", "#6b6b6b")


def _svg(w: float, h: float, label: str, parts: list[str]) -> str:
    """An inline plot: ``parts`` (SVG elements) on a ``w`` × ``h`` canvas; ``label`` is escaped."""
    head = f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" '
    return f'{head}aria-label="{html.escape(label)}">{"".join(parts)}</svg>'


def _svg_bars(title: str, labels: list[str], values: list[float | None], vmax: float = 100.0) -> str:
    w, row_h, left = 640, 26, 190
    h = 40 + row_h * len(labels)
    parts = [f'<text x="10" y="20" font-weight="bold">{html.escape(title)}</text>']
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
    return _svg(w, h, title, parts)


def _svg_stages(rows: list[dict[str, Any]]) -> str:
    w, h, left, bottom = 640, 260, 40, 220
    stages = [s.upper() for s in STAGE_KEYS]
    models = [r for r in rows if r["model"] != "(all)"]
    group_w = (w - left - 20) / len(stages)
    bar_w = max(2.0, (group_w - 10) / max(1, len(models)))
    parts = [
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
    return _svg(w, h + 20 + 16 * len(models), "Stage means", parts)


def _svg_scatter(track: str, pts: list[tuple[float, float]], r: float | None, unit: str = "cost") -> str:
    """OVERALL against cost (``unit="cost"``) or, where costs are unknown, against tokens."""
    w, h, left, bottom = 300, 220, 44, 180
    xmax = max([p[0] for p in pts] + [1e-9])
    top = f"${xmax:.2f}" if unit == "cost" else f"{xmax:,.0f} tokens"
    title = f"{html.escape(track)}: {unit} vs OVERALL (r = {'—' if r is None else f'{r:.2f}'})"
    parts = [
        f'<text x="8" y="16" font-weight="bold">{title}</text>',
        f'<line x1="{left}" y1="{bottom}" x2="{w - 10}" y2="{bottom}" stroke="#444"/>',
        f'<line x1="{left}" y1="28" x2="{left}" y2="{bottom}" stroke="#444"/>',
        f'<text x="{w - 10}" y="{bottom + 16}" text-anchor="end">{top}</text>',
        f'<text x="{left - 4}" y="34" text-anchor="end">100</text>',
    ]
    for x, y in pts:
        px = left + (w - left - 14) * x / xmax
        py = bottom - (bottom - 30) * y
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="#3b6ea5" fill-opacity="0.6"/>')
    return _svg(w, h, f"{unit.capitalize()} vs OVERALL, {track}", parts)


def _html_table(rows: list[dict[str, Any]], table_id: str) -> str:
    if not rows:
        return "<p>No rows.</p>"
    cols = list(rows[0].keys())
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(r.get(c), c))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _stability_html(st: dict[str, Any]) -> str:
    """The judge's stability over its repeats: per-item agreement and alpha, and the spread."""
    items = [
        {
            "item": i["item"],
            "units": i["units"],
            "agreement": rounded(i["agreement"], 4),
            "alpha": "no variation" if i["alpha"] is None else round(i["alpha"], 4),
            "flips": i["flips"],
            "flipping runs": ", ".join(i["flipping_runs"][:5]),
        }
        for i in st["items"]
    ]
    o = st["overall"]
    spread = [
        {"score": f.upper(), "max range": rounded(v["max_range"], 4), "mean SD": rounded(v["mean_sd"], 4)}
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
        link = f"{base}/runs/{urllib.parse.quote(r['run_id'], safe='')}" if base else ""
        rid = _run_link(r["run_id"], link)
        overall, codes = x100(r.get("overall")), " ".join(r.get("codes") or [])
        cells = [*(r.get(k) for k in ("task", "tier", "model", "status")), overall, codes]
        body.append(
            f"<tr><td>{rid}</td>" + "".join(f"<td>{html.escape(cell(c))}</td>" for c in cells) + "</tr>"
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


def _scans_html(report: dict[str, Any]) -> str:
    """Each scanner's share of runs flagged per model and track, and the judge against each label
    set (``amb report``'s scan part); every name, value and link is agents' or users' text."""
    out = []
    if report.get("scanners"):
        shares = [s | {"share": rounded(s["share"], 4)} for s in report["scanners"]]
        out.append(f"<h2>Scanners: share of runs flagged</h2>{_html_table(shares, 'scanner_shares')}")
    for name, results in (report.get("judge_validation") or {}).items():
        rows = [
            {"target": r["target"], "runs": r["runs"]}
            | {k: rounded(r.get(k), 4) for k in ("agreement", "kappa", "alpha", "precision", "recall", "f1")}
            | {"kappa 95%": _interval(r["intervals"].get("kappa")), "disagree": len(r["disagreements"])}
            for r in results
        ]
        links = "".join(
            f"<li>{html.escape(r['target'])} {_run_link(d['run_id'], d['link'])}: label "
            f"{html.escape(repr(d['label']))}, judge {html.escape(repr(d['predicted']))}</li>"
            for r in results
            for d in r["disagreements"][:20]
        )
        out.append(
            f"<h2>Judge against labels {html.escape(name)}</h2>{_html_table(rows, 'judge_validation')}"
            + (f'<ul class="disagreements">{links}</ul>' if links else "")
        )
    return "".join(out)


def _interval(ci: list[float] | None) -> str:
    return "—" if not ci else f"{ci[0]:.2f}..{ci[1]:.2f}"


def _run_link(run_id: str, link: str) -> str:
    """A run id, linked into the viewer when there is a viewer link (escaped either way)."""
    rid = html.escape(run_id)
    return f'<a href="{html.escape(link, quote=True)}">{rid}</a>' if link else rid


def _plots(report: dict[str, Any]) -> dict[str, str]:
    """The plot shown under each view's table, by view (a view without one is absent)."""
    lb, shares, by_n = report["leaderboard"], report["code_shares"], report["overall_by_code_count"]
    plots = {
        "leaderboard": _svg_bars(
            "OVERALL per model (×100)", [r["model"] for r in lb], [r["overall"] for r in lb]
        ),
        "stage_means": _svg_stages(report["stage_means"]),
        "code_shares": _svg_bars(
            "Share of fired error codes (%)", [c["code"] for c in shares], [c["share_pct"] for c in shares]
        ),
    }
    if report["medals"]:
        everyone, kinds = report["medals"][-1], (*get_args(Rating), "unrated")
        pct = [percent(everyone[k], everyone["runs"]) for k in kinds]
        plots["medals"] = _svg_bars("Ratings, all runs (% of runs)", list(kinds), pct)
    if by_n:
        labels, values = [f"{c['codes']} codes" for c in by_n], [c["overall"] for c in by_n]
        plots["overall_by_code_count"] = _svg_bars("OVERALL by number of codes (×100)", labels, values)
    if scatters := "".join(_scatter(report, c) for c in report["cost_correlation"]):
        plots["cost_correlation"] = f'<div class="row">{scatters}</div>'
    return plots


def html_page(
    report: dict[str, Any],
    title: str = "AMB score report",
    runs: list[dict[str, Any]] | None = None,
    viewer_url: str | None = None,
) -> str:
    plots = _plots(report)
    sections = [
        f"<h2>{html.escape(name)}</h2>{_html_table(report[key], key)}{plots.get(key, '')}"
        for name, key in SECTIONS
        if key != "cost_unknown" or report[key]
    ]
    stability = report.get("judge_stability")
    if stability:
        sections.append(_stability_html(stability))
    sections.append(_scans_html(report))
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
