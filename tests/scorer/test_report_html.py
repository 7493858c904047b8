"""The report: its views as data, and the HTML page rendered by headless Chromium (.ci/chromium.sh)."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from scorer import report, report_html

CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _rows(n=60, seed=3):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        model = ["opus-4.6", "glm-5", "gpt-5.4"][i % 3]
        track = ["segmentation", "vqa", "detection"][i % 3 - (i // 3) % 2]
        codes = sorted(rng.sample(["E2", "E3", "E4", "E5"], rng.randint(0, 3)))
        s = [rng.random() for _ in range(5)]
        agentic = 0.25 * s[0] + 0.15 * s[1] + 0.35 * s[2] + 0.15 * s[3] + 0.10 * s[4]
        task = rng.random() if i % 7 else None
        rows.append(
            {
                "run_id": f"r{i}",
                "model": model,
                "track": track,
                "tier": "lite" if i % 2 else "standard",
                "s1": s[0],
                "s2": s[1],
                "s3": s[2],
                "s4": s[3],
                "s5": s[4],
                "agentic": agentic,
                "task_score": task,
                "overall": None if task is None else 0.5 * agentic + 0.5 * task,
                "codes": codes,
                "status": "completed" if rng.random() < 0.6 else "failed",
                "cost_usd": rng.uniform(0.5, 20),
                "turns": rng.randint(10, 50),
                "judge": "offline:rules-v1",
                "medal": None
                if task is None
                else ("good" if task >= 0.7 else "okay" if task >= 0.3 else "fail"),
                "rating": None if task is None else ("A" if task >= 0.7 else "B" if task >= 0.3 else "C"),
                "profile_name": "paper-2026-06",
                "profile_id": "sha256:" + "ab" * 32,
            }
        )
    return rows


def test_views():
    rows = _rows()
    data = report.build(rows)
    assert [r["model"] for r in data["leaderboard"]] and data["runs"] == 60
    assert sum(r["runs"] for r in data["leaderboard"]) == 60
    shares = [c["share_pct"] for c in data["code_shares"] if c["share_pct"] is not None]
    assert sum(shares) == pytest.approx(100, abs=0.5)
    multi = [r for r in rows if len(r["codes"]) >= 2]
    allrec = next(r for r in data["recovery"] if r["model"] == "(all)")
    assert allrec["runs_2plus_codes"] == len(multi)
    assert allrec["completed"] == sum(1 for r in multi if r["status"] == "completed")
    tier = data["tiers"][0]
    assert tier["delta_pct"] == pytest.approx(
        100 * (tier["lite"] - tier["standard"]) / tier["standard"], abs=0.3
    )
    # unscored runs are left out of means, never averaged in as 0
    scored = [r["overall"] for r in rows if r["model"] == "opus-4.6" and r["overall"] is not None]
    lb = next(r for r in data["leaderboard"] if r["model"] == "opus-4.6")
    assert lb["overall"] == round(100 * sum(scored) / len(scored), 1) and lb["scored"] == len(scored)


def test_medal_view():
    rows = _rows()
    data = report.build(rows)
    everyone = data["medals"][-1]
    assert everyone["model"] == "(all)" and everyone["runs"] == 60
    assert everyone["A"] == sum(1 for r in rows if r["rating"] == "A")
    assert everyone["unrated"] == sum(1 for r in rows if r["rating"] is None)
    assert everyone["resolved_pct"] == round(100 * sum(1 for r in rows if r["rating"] in ("A", "B")) / 60, 1)


def test_the_views_fold_rows_as_they_come_and_keep_none():
    """``build`` reads its rows once, in any order, as a stream of any length: the views are the
    same as over the list in run order (means, ties between models, the plots' points in run
    order), and no row is held once folded."""
    import gc
    import weakref

    class Row(dict):  # (a dict that a weak reference can point to)
        pass

    rows = sorted(_rows(n=300, seed=7), key=lambda r: r["run_id"])
    for i, r in enumerate(rows):
        r["tokens_in"], r["tokens_out"] = (None, None) if i % 5 == 0 else (1000 + i, 10 * i)
        r["reasons"] = {"cost": "no price"} if i % 11 == 0 else {}
        r["cost_usd"] = None if i % 11 == 0 else r["cost_usd"]
        if r["run_id"] in ("r150", "r151"):  # two models of one mean: the one of the first run first
            r["model"], r["overall"] = {"r150": "tied", "r151": "tied-too"}[r["run_id"]], 0.5
    alive: list[weakref.ref] = []

    def shuffled():
        order = list(range(len(rows)))
        random.Random(1).shuffle(order)
        for i in order:
            row = Row(rows[i])
            alive.append(weakref.ref(row))
            yield row

    data = report.build(shuffled())
    gc.collect()
    assert data == report.build(rows) and len(alive) == 300 and all(ref() is None for ref in alive)
    models = [m["model"] for m in data["leaderboard"]]
    assert models.index("tied") + 1 == models.index("tied-too")
    vqa = [r["overall"] for r in rows if r["track"] == "vqa" and None not in (r["overall"], r["cost_usd"])]
    assert [p[1] for p in data["scatter"]["vqa"]] == vqa


def _with_stability(data):
    from scorer.judge_stability import agreement_table, spread

    def rows(flip):
        return [
            {
                "run_id": f"r{i}",
                "s1": 0.5 + flip * (i % 2) / 4,
                "s2": 1.0,
                "s3": 0.5,
                "agentic": 0.6,
                "details": {
                    "items": [
                        {"id": "s1b", "source": "judge", "value": float((i + flip) % 2 if i % 2 else 1)},
                        {"id": "s2a", "source": "judge", "value": 1.0},
                    ]
                },
            }
            for i in range(6)
        ]

    coders = [rows(0), rows(1)]
    data["judge_stability"] = {
        "repeats": 2,
        "judges": ["llm:j", "llm:j#r1"],
        **agreement_table(coders),
        "spread": spread(coders),
    }
    return data


def test_pearson():
    assert report.pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert report.pearson([1, 2], [1, 2]) is None
    assert report.pearson([1, 1, 1], [1, 2, 3]) is None


def test_html_opens_in_headless_chromium(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is required: run .ci/chromium.sh"
    page = tmp_path / "report.html"
    page.write_text(report_html.html_page(_with_stability(report.build(_rows()))), encoding="utf-8")
    assert "http://" not in page.read_text().replace("http://www.w3.org/2000/svg", "")  # no network assets
    flags = CHROME_FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert '<table id="leaderboard">' in dom.stdout
    assert '<table id="medals">' in dom.stdout and "Ratings, all runs" in dom.stdout
    assert '<table id="judge_stability">' in dom.stdout and "Judge stability over 2 repeats" in dom.stdout
    assert dom.stdout.count('<svg class="plot"') >= 5
    assert "opus-4.6" in dom.stdout
    shot = tmp_path / "shot.png"
    run = subprocess.run(
        [chromium, *flags, "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    from PIL import Image

    img = Image.open(shot).convert("L")
    assert img.size == (1200, 1600)
    lo, hi = img.getextrema()
    assert isinstance(lo, int) and isinstance(hi, int)  # one band: plain numbers
    assert hi - lo > 100  # something was drawn, not a blank page


def test_unknown_cost_shows_tokens_and_why():
    rows = _rows(n=12, seed=5)
    for i, r in enumerate(rows):
        r["tokens_in"], r["tokens_out"] = 1000 * (i + 1), 10 * (i + 1)
        r["reasons"] = {}
        if r["model"] == "glm-5":  # a model the price table does not list
            r["cost_usd"] = None
            r["reasons"] = {"cost": "not in price table openrouter-2026-05-28: glm-5"}
    data = report.build(rows)
    glm = next(r for r in data["leaderboard"] if r["model"] == "glm-5")
    glm_tokens = [1010 * (i + 1) for i, r in enumerate(rows) if r["model"] == "glm-5"]
    assert glm["cost_per_run"] is None
    assert glm["tokens_per_run"] == round(sum(glm_tokens) / len(glm_tokens))
    assert data["cost_unknown"] == [
        {"model": "glm-5", "runs": 4, "why": "not in price table openrouter-2026-05-28: glm-5"}
    ]
    text = report.terminal(data, lambda cols, rs: "\n".join(" | ".join(r) for r in [cols, *rs]))
    assert "Why a cost is unknown" in text and "not in price table openrouter-2026-05-28: glm-5" in text
    page = report_html.html_page(data)
    assert "not in price table openrouter-2026-05-28: glm-5" in page and "cost vs OVERALL" in page

    # No run has a cost (nothing priced): the plots show tokens against OVERALL instead of nothing.
    for r in rows:
        r["cost_usd"] = None
    data = report.build(rows)
    assert all(c["cost_per_run"] is None and c["tokens_per_run"] for c in data["cost_correlation"])
    page = report_html.html_page(data)
    assert "tokens vs OVERALL" in page and "cost vs OVERALL" not in page
    scored = [(1010 * (i + 1), r["overall"]) for i, r in enumerate(rows) if r["overall"] is not None]
    assert sum(len(p) for p in data["scatter_tokens"].values()) == len(scored)
    assert data["leaderboard"][0]["cost_per_run"] is None


def test_a_cost_known_for_some_runs_only_is_unknown_and_a_small_one_is_not_zero():
    rows = _rows(n=12, seed=5)
    for r in rows:
        r["reasons"] = {}
        if r["model"] == "glm-5":
            r["cost_usd"] = 0.00042  # a cheap model: a fraction of a cent per run
        if r["run_id"] == "r0":  # one run of opus-4.6 through a model the table does not list
            r["cost_usd"] = None
            r["reasons"] = {"cost": "not in price table openrouter-2026-05-28: opus-x"}
    data = report.build(rows)
    by_model = {r["model"]: r for r in data["leaderboard"]}
    assert by_model["opus-4.6"]["cost_per_run"] is None  # not the mean of its priced runs alone
    assert by_model["glm-5"]["cost_per_run"] == 0.00042
    assert by_model["gpt-5.4"]["cost_per_run"] > 0
    track_r0 = rows[0]["track"]
    assert next(c for c in data["cost_correlation"] if c["track"] == track_r0)["cost_per_run"] is None
    text = report.terminal(data, lambda cols, rs: "\n".join(" | ".join(r) for r in [cols, *rs]))
    opus = next(line for line in text.splitlines() if line.startswith("opus-4.6 | ") and "unknown" in line)
    assert opus.split(" | ")[list(by_model["opus-4.6"]).index("cost_per_run")] == "unknown"
    glm = next(line for line in text.splitlines() if line.startswith("glm-5 | "))
    assert "0.00042" in glm.split(" | ")
    assert "<td>unknown</td>" in report_html.html_page(data)


HOSTILE = "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"


def _with_scans(data):
    """``amb report``'s scan part, with scanner names, groups, run ids and values that are markup."""
    from scorer import labels

    data["scanners"] = [
        {"scanner": HOSTILE, "by": "model", "group": HOSTILE, "runs": 4, "flagged": 1, "share": 0.25},
        {"scanner": "grader_read", "by": "track", "group": "vqa", "runs": 0, "flagged": 0, "share": None},
    ]
    data["judge_validation"] = {
        HOSTILE: [
            labels.compare(
                "code:E3",
                {"a": True, HOSTILE: False, "c": True},
                {"a": True, HOSTILE: True, "c": False},
                link="http://127.0.0.1:8765/",
            )
        ]
    }
    return data


def test_the_scan_part_renders_in_chromium_as_text(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is required: run .ci/chromium.sh"
    page = tmp_path / "report.html"
    page.write_text(report_html.html_page(_with_scans(report.build(_rows()))), encoding="utf-8")
    flags = CHROME_FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    out = dom.stdout
    assert '<table id="scanner_shares">' in out and "Scanners: share of runs flagged" in out
    assert '<table id="judge_validation">' in out and "code:E3" in out
    assert "<title>AMB score report</title>" in out  # no script ran
    assert "<img" not in out and "<script" not in out and "&lt;img src=x" in out
    # Each disagreeing run links into the viewer, its id escaped in the text and quoted in the link.
    assert 'href="http://127.0.0.1:8765/runs/%3Cimg%20src%3Dx' in out
    assert 'href="http://127.0.0.1:8765/runs/c">c</a>' in out
