"""`amb score`, `amb report`, `amb audit` through the real CLI on a real store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from amb.main import cli


@pytest.fixture(scope="module")
def store(synthetic_store):
    return str(synthetic_store("cli", 10, 10))


def amb(*args, env=None):
    env = {"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": "", **(env or {})}
    return CliRunner().invoke(cli, list(args), env=env)


def test_score_report_audit(store, tmp_path):
    r = amb("score", "--store", store, "--all", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert (
        len(out["rows"]) == 10
        and out["judge"] == "offline:rules-v1"
        and out["profile"]["name"] == "paper-2026-06"
    )
    assert all(row["profile_id"] == out["profile"]["id"] for row in out["rows"])
    r = amb("score", "--store", store, "run-1", "run-2")
    assert r.exit_code == 0 and "offline rule-based judge" in r.output and "run-2" in r.output
    # The synthetic runs' models are in no price table: their cost reads unknown, never 0.
    header, _, *table = r.output.splitlines()[1:]
    cost = header.split().index("cost_usd")
    assert [line.split()[cost] for line in table if line.startswith("run-")] == ["unknown", "unknown"]
    r = amb(
        "score",
        "--store",
        store,
        "--all",
        "--profile",
        "code-2026-04",
        "--compare",
        "paper-2026-06",
        "--json",
    )
    assert r.exit_code == 0, r.output
    changes = json.loads(r.output)["compare"]["changes"]
    assert changes and {c["field"] for c in changes} <= {
        "s1",
        "s2",
        "s3",
        "s4",
        "s5",
        "agentic",
        "task_score",
        "overall",
        "status",
        "codes",
    }
    page = tmp_path / "r.html"
    r = amb("report", "--store", store, "--html", str(page))
    assert (
        r.exit_code == 0
        and "Leaderboard per model" in r.output
        and page.read_text().startswith("<!DOCTYPE html>")
    )
    r = amb("report", "--store", store, "--json")
    assert json.loads(r.output)["runs"] == 10
    r = amb("audit", "--store", store, "run-3", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["status"] in ("clean", "violation")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["score"], 2, "RUN ids or --all"),
        (["score", "no-such-run"], 3, "no run 'no-such-run' in the store at "),
        (["score", "--all", "--profile", "nope"], 2, "no such file"),
        (["score", "--all", "--judge", "llm"], 2, "AMB_JUDGE_BASE_URL"),
        (["audit", "no-such-run"], 3, "no run 'no-such-run' in the store at "),
    ],
    ids=["no-runs", "unknown-run", "bad-profile", "llm-without-endpoint", "audit-unknown"],
)
def test_bad_input_is_one_line(store, args, code, message):
    cmd, rest = args[0], args[1:]
    r = amb(cmd, "--store", store, *rest)
    assert r.exit_code == code, r.output
    assert message in r.output and "Traceback" not in r.output


def test_score_with_the_llm_judge_through_the_cli(store):
    from tests.fakes import judge_server as fake

    def policy(req):
        text = fake.user_text(req)
        if text.startswith("Error codes"):
            return fake.Reply(content='{"codes": []}')
        return fake.verdict(fake.asked_item(req), 1)

    with fake.JudgeServer(policy) as server:
        env = {
            "AMB_JUDGE_BASE_URL": server.base_url,
            "AMB_JUDGE_MODEL": "fake-judge",
            "AMB_JUDGE_API_KEY": "k",
        }
        r = amb(
            "score", "--store", store, "run-1", "run-2", "--json", env=env
        )  # llm is the default with an endpoint
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        assert out["judge"] == "llm:fake-judge" and out["judge_requests"] == len(server.requests) > 0
        assert all(row["s1"] == 1.0 and row["s3"] == 1.0 for row in out["rows"])
        r = amb("score", "--store", store, "run-1", "run-2", env=env)
        assert r.exit_code == 0 and "judge: llm:fake-judge" in r.output and "judge requests: 0" in r.output
        r = amb("score", "--store", store, "run-1", "--judge", "offline", env=env)
        assert "offline rule-based judge" in r.output


def test_a_report_for_a_judge_without_rows_is_one_line(store):
    # The profile has rows (from the offline judge), the judge asked for has none.
    assert amb("score", "--store", store, "--all", "--profile", "code-2026-04").exit_code == 0
    r = amb("report", "--store", store, "--profile", "code-2026-04", "--judge", "llm:x")
    assert r.exit_code == 2, r.output
    assert "no rows from judge 'llm:x'" in r.output and "Traceback" not in r.output


def test_scoring_with_the_offline_judge_does_not_import_the_llm_client(store):
    """`amb score --judge offline` never asks an endpoint, so it does not pay for importing the
    OpenAI client (about a second of CPU, most of the command's start): run in a fresh interpreter,
    the client is not among the modules it loaded."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from amb.main import cli\n"
        "try:\n"
        f"    cli(['score', '--all', '--judge', 'offline', '--store', {store!r}])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print('openai' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr


def _ledger_row(run: str, judge: str, model: str, track: str, tier: str, status: str, *values, **more):
    """A score row as the ledger holds it; ``values``: OVERALL, AGENTIC (S1 too), task score, cost,
    input and output tokens, turns, and the fired codes."""
    from schemas.score_row import COLUMNS, ScoreRow
    from scorer.profile import load

    prof = load("paper-2026-06")
    names = ("overall", "agentic", "task_score", "cost_usd", "tokens_in", "tokens_out", "turns", "codes")
    fields: dict[str, Any] = dict.fromkeys(COLUMNS) | dict(zip(names, values, strict=True))
    fields |= {"run_id": run, "profile_id": prof.id, "profile_name": prof.name, "judge": judge}
    fields |= {"model": model, "task": "t", "track": track, "tier": tier, "status": status}
    fields |= {"agent": "a", "s1": fields["agentic"], "audit_status": "clean", "fingerprint": run}
    fields |= {"reasons": {}, "details": {"items": [{"id": "s1a", "source": "judge", "value": 1.0}]}}
    if fields["agentic"] < 0.45:
        fields["details"]["items"][0]["value"] = 0.0
    return ScoreRow(**(fields | more))


def test_the_report_of_a_ledger_with_edge_cases(synthetic_store, tmp_path):
    """`amb report --json` over a ledger written by hand: unscored values left out of means, an
    unknown cost (with its reason) making a mean cost unknown, a track with too few points for a
    Pearson r, a run rescored (its latest row counts), rows in no run order, and a judge with a
    repeat (the report shows the judge, not its repeat, though the repeat has more rows). Each
    view is checked against values worked out by hand."""
    from statistics import correlation

    from scorer import ledger
    from scorer.batch import open_store

    store = synthetic_store("ledger", 1, 1)
    a, b, seg, s = "model-a", "model-b", "segmentation", "standard"
    e235 = ["E2", "E3", "E5"]
    # run, model, track, tier, status, OVERALL, AGENTIC, TASK, cost, tokens in and out, turns, codes
    table = [
        ("b2", b, seg, s, "failed", 0.5, 0.4, 0.5, 4.0, None, 100, 30, ["E3", "E4"], "okay", "B"),
        ("a3", a, "vqa", "lite", "completed", 0.3, 0.4, 0.4, None, 10, None, None, e235, "fail", "C"),
        ("b1", b, seg, s, "breach", 0.9, 0.6, 0.9, 2.0, 300, 0, 30, [], "good", "A"),
        ("a2", a, seg, "lite", "failed", None, 0.3, None, 3.0, 200, None, 20, ["E2"], None, None),
        ("b3", b, "vqa", "lite", "completed", 0.7, 0.8, 0.7, 1.5, 40, 10, 30, [], "okay", "B"),
        ("a1", a, seg, s, "completed", 0.6, 0.5, 0.8, 1.0, 100, 20, 10, ["E2", "E3"], "good", "A"),
    ]
    rows = {t[0]: _ledger_row(t[0], "llm:j", *t[1:-2], medal=t[-2], rating=t[-1]) for t in table}
    rows["a3"].reasons = {"cost": "no price for model-a", "S4": "no grade"}
    stale = _ledger_row("a1", "llm:j", a, seg, s, "completed", 0.1, 0.1, 0.1, 9.0, 1, 1, 1, ["E1"])
    repeat = [
        _ledger_row(r.run_id, "llm:j#r1", r.model, r.track, r.tier, r.status, *[0.2] * 3, 1.0, 1, 1, 1, [])
        for r in rows.values()
    ]
    repeat.append(_ledger_row("c1", "llm:j#r1", "model-c", seg, s, "completed", *[0.2] * 3, 1.0, 1, 1, 1, []))
    offline = [
        _ledger_row(run, "offline:rules-v1", b, seg, s, "completed", *[0.5] * 3, 1.0, 1, 1, 1, [])
        for run in ("a1", "a2")
    ]
    with open_store(store) as st:
        ledger.append_rows(st.con, "batch-1", [stale, rows["b2"], rows["a3"], *offline])
        ledger.append_rows(st.con, "batch-2", [rows["b1"], rows["a2"], rows["b3"], *repeat])
        ledger.append_rows(st.con, "batch-3", [rows["a1"]])
    r = amb("report", "--store", str(store), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["runs"] == 6 and data["judges"] == ["llm:j"]
    assert data["judge_stability"]["judges"] == ["llm:j", "llm:j#r1"]
    assert data["leaderboard"] == [
        {"model": b, "runs": 3, "scored": 3, "overall": 70.0, "agentic": 60.0, "task": 70.0}
        | {"cost_per_run": 2.5, "tokens_per_run": 150.0, "turns": 30.0, "breaches": 1},
        {"model": a, "runs": 3, "scored": 2, "overall": 45.0, "agentic": 40.0, "task": 60.0}
        | {"cost_per_run": None, "tokens_per_run": 110.0, "turns": 15.0, "breaches": 0},
    ]
    assert [
        {k: m[k] for k in ("model", "good", "okay", "fail", "A", "B", "C", "unrated", "resolved_pct")}
        for m in data["medals"]
    ] == [
        {
            "model": b,
            "good": 1,
            "okay": 2,
            "fail": 0,
            "A": 1,
            "B": 2,
            "C": 0,
            "unrated": 0,
            "resolved_pct": 100.0,
        },
        {
            "model": "model-a",
            "good": 1,
            "okay": 0,
            "fail": 1,
            "A": 1,
            "B": 0,
            "C": 1,
            "unrated": 1,
            "resolved_pct": 33.3,
        },
        {
            "model": "(all)",
            "good": 2,
            "okay": 2,
            "fail": 1,
            "A": 2,
            "B": 2,
            "C": 1,
            "unrated": 1,
            "resolved_pct": 66.7,
        },
    ]
    assert data["per_track"] == [
        {"model": b, seg: 70.0, "vqa": 70.0},
        {"model": "model-a", seg: 60.0, "vqa": 30.0},
    ]
    assert data["tiers"] == [
        {"model": b, "standard": 50.0, "lite": 80.0, "delta_pct": 60.0},
        {"model": "model-a", "standard": 50.0, "lite": 35.0, "delta_pct": -30.0},
    ]
    assert [(m["model"], m["S1"], m["S2"]) for m in data["stage_means"]] == [
        (b, 60.0, None),
        ("model-a", 40.0, None),
        ("(all)", 50.0, None),
    ]
    assert [(c["code"], c["count"], c["share_pct"]) for c in data["code_shares"]] == [
        ("E1", 0, 0.0),
        ("E2", 3, 37.5),
        ("E3", 3, 37.5),
        ("E4", 1, 12.5),
        ("E5", 1, 12.5),
    ]
    assert data["overall_by_code_count"] == [
        {"codes": "0", "runs": 2, "overall": 80.0},
        {"codes": "1", "runs": 1, "overall": None},
        {"codes": "2", "runs": 2, "overall": 55.0},
        {"codes": "3+", "runs": 1, "overall": 30.0},
    ]
    assert [tuple(m.values()) for m in data["recovery"]] == [
        (b, 1, 0, 0.0),
        ("model-a", 2, 2, 100.0),
        ("(all)", 3, 2, 66.7),
    ]
    # segmentation's scored runs in run order: a1, b1, b2 (a2 is unscored); vqa has one priced run
    # (a3's cost is unknown) and two with tokens: too few points for an r.
    assert data["cost_correlation"] == [
        {"track": seg, "points": 3, "pearson_r": round(correlation([1.0, 2.0, 4.0], [0.6, 0.9, 0.5]), 3)}
        | {"cost_per_run": 2.5, "tokens_per_run": 180.0}
        | {"pearson_r_tokens": round(correlation([120.0, 300.0, 100.0], [0.6, 0.9, 0.5]), 3)},
        {"track": "vqa", "points": 1, "pearson_r": None, "cost_per_run": None, "tokens_per_run": 30.0}
        | {"pearson_r_tokens": None},
    ]
    assert data["scatter_tokens"] == {
        seg: [[120.0, 0.6], [300.0, 0.9], [100.0, 0.5]],
        "vqa": [[10.0, 0.3], [50.0, 0.7]],
    }
    assert data["cost_unknown"] == [{"model": "model-a", "runs": 1, "why": "no price for model-a"}]
    text = amb("report", "--store", str(store)).output
    assert "Why a cost is unknown" in text and "no price for model-a" in text
    # The repeat's own report reads its rows as they come; with the page, whole: the same views.
    streamed = amb("report", "--store", str(store), "--json", "--judge", "llm:j#r1")
    page = tmp_path / "r.html"
    whole = amb("report", "--store", str(store), "--json", "--judge", "llm:j#r1", "--html", str(page))
    assert streamed.exit_code == whole.exit_code == 0 and page.exists()
    assert json.loads(streamed.output)["runs"] == 7 and streamed.output == whole.output
