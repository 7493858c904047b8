"""Judges you can measure: repeats against a scripted loopback judge whose answers vary with the
request's seed; agreement and Krippendorff's alpha against hand-computed values; the cache makes a
second ``--repeat N`` scoring ask nothing; ``amb judge compare`` between two judges."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from amb.main import cli
from scorer.batch import open_store, score_runs
from scorer.judge_stability import agreement_table, krippendorff_alpha_nominal, pair_agreement
from scorer.profile import load
from tests.fakes import judge_server as fake

SEED = load("paper-2026-06").profile.judge.seed or 0
FLIPPING = "s1b"
ANSWERS = {SEED: 1, SEED + 1: 0, SEED + 2: 1}
"""s1b's answer by the request's seed (repeat r is asked with seed + r); every other item: top value."""


def policy(req):
    item = fake.asked_item(req)
    if item == "codes":
        return fake.Reply(content='{"codes": []}')
    if item == FLIPPING:
        return fake.verdict(item, ANSWERS[req.get("seed", SEED)])
    return fake.default_policy(req)


def test_alpha_and_agreement_by_hand():
    # Units (1,1), (0,0), (1,0). Coincidences: o11 = 2, o00 = 2, o10 = o01 = 1; n1 = n0 = 3, n = 6.
    # alpha = 1 - (n-1)·Σ_{c≠k} o_ck / Σ_{c≠k} n_c·n_k = 1 - 5·2 / 18.
    assert krippendorff_alpha_nominal([(1, 1), (0, 0), (1, 0)]) == pytest.approx(1 - 10 / 18)
    # Three coders on one unit (1, 1, 0) plus a unit (0, 0, 0): o11 = 1, o10 = o01 = 1, o00 = 3;
    # n1 = 2, n0 = 4, n = 6 → 1 - 5·2 / (2·2·4).
    assert krippendorff_alpha_nominal([(1, 1, 0), (0, 0, 0)]) == pytest.approx(1 - 10 / 16)
    assert krippendorff_alpha_nominal([(1, 1), (1, 1)]) is None  # no variation: alpha undefined
    assert pair_agreement((1, 0, 1)) == pytest.approx(1 / 3)
    # Four-valued items (enhancement S3 {0, 0.2, 0.5, 1}) are nominal categories too.
    assert krippendorff_alpha_nominal([(0.2, 0.5), (0.5, 0.5), (1.0, 1.0)]) == pytest.approx(
        1 - 5 * 2 / (2 * (1 * 3 + 1 * 2 + 3 * 2))
    )


@pytest.fixture(scope="module")
def store(synthetic_store):
    return synthetic_store("stability", 4, 8)


def test_repeat_agreement_alpha_spread_and_cache(store, monkeypatch):
    prof = load("paper-2026-06")
    with fake.JudgeServer(policy) as server:
        monkeypatch.setenv("AMB_JUDGE_BASE_URL", server.base_url)
        monkeypatch.setenv("AMB_JUDGE_MODEL", "fake-judge")
        with open_store(store) as st:
            first = score_runs(st, prof, judge="llm", repeat=3)
            asked = len(server.requests)
            seeds = {r.get("seed") for r in server.requests}
            again = score_runs(st, prof, judge="llm", repeat=3)
            stored = st.con.execute(
                "SELECT count(*), count(DISTINCT key) FROM judge_calls WHERE item = ?", [FLIPPING]
            ).fetchone()
    assert seeds == {SEED, SEED + 1, SEED + 2}
    assert [first.judge] + [r.judge for r in first.repeats] == [
        "llm:fake-judge",
        "llm:fake-judge#r1",
        "llm:fake-judge#r2",
    ]
    # The cache: the second --repeat 3 asks nothing, in any repeat, and reproduces every row.
    assert again.judge_requests == 0 and all(r.judge_requests == 0 for r in again.repeats)
    assert len(server.requests) == asked
    assert [r["fingerprint"] for r in again.rows] == [r["fingerprint"] for r in first.rows]

    s = first.stability
    assert s is not None and s["repeats"] == 3
    flip = next(i for i in s["items"] if i["item"] == FLIPPING)
    units = flip["units"]
    assert units > 0 and stored == (3 * units, 3 * units)  # every answer stored, one key per repeat
    # Each unit is (1, 0, 1): agreement 1/3 of the pairs; coincidences per unit o11 = 1,
    # o10 = o01 = 1, so over U units n1 = 2U, n0 = U, n = 3U and
    # alpha = 1 - (3U - 1)·2U / (2·2U·U) = 1 - (3U - 1) / (2U).
    assert flip["agreement"] == pytest.approx(1 / 3)
    assert flip["alpha"] == pytest.approx(1 - (3 * units - 1) / (2 * units))
    assert flip["flips"] == units and flip["flipping_runs"] == sorted(flip["flipping_runs"])
    for other in (i for i in s["items"] if i["item"] != FLIPPING):
        assert other["agreement"] == 1.0 and other["alpha"] is None and other["flips"] == 0
    # Pooled: S stable units of (1, 1, 1) add o11 = 3 each: alpha = 1 - (3S + 3U - 1) / (3S + 2U).
    stable = s["overall"]["units"] - units
    assert s["overall"]["alpha"] == pytest.approx(1 - (3 * stable + 3 * units - 1) / (3 * stable + 2 * units))
    # Spread: s1b moves S1 by 1/k (k = the run's S1 items) between repeats.
    by_run = {r["run_id"]: r for r in first.rows}
    for e in s["spread"]["runs"]:
        items = [i for i in by_run[e["run_id"]]["details"]["items"] if i["stage"] == "S1"]
        judged = any(i["id"] == FLIPPING and i["source"] == "judge" for i in items)
        assert e["s1_range"] == pytest.approx(1 / len(items) if judged else 0.0)


def test_amb_judge_compare_and_report(store, monkeypatch, tmp_path):
    env = {"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": ""}
    runner = CliRunner()
    r = runner.invoke(cli, ["score", "--store", str(store), "--all", "--judge", "offline"], env=env)
    assert r.exit_code == 0, r.output
    with fake.JudgeServer(policy) as server:
        llm_env = {"AMB_JUDGE_BASE_URL": server.base_url, "AMB_JUDGE_MODEL": "fake-judge"}
        r = runner.invoke(
            cli, ["score", "--store", str(store), "--all", "--judge", "llm", "--repeat", "3"], env=llm_env
        )
        assert r.exit_code == 0, r.output
        assert "judge stability over 3 repeats" in r.output and "Krippendorff" in r.output
    r = runner.invoke(
        cli,
        [
            "judge",
            "compare",
            "--store",
            str(store),
            "--a",
            "offline:rules-v1",
            "--b",
            "llm:fake-judge",
            "--json",
        ],
        env=env,
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    with open_store(store) as st:
        from scorer import ledger

        rows = ledger.current(st.con, profile_id=load("paper-2026-06").id)
    a = {x["run_id"]: x for x in rows if x["judge"] == "offline:rules-v1"}
    b = {x["run_id"]: x for x in rows if x["judge"] == "llm:fake-judge"}
    # Hand count for one item: the share of runs where both judges gave the same value.
    same = total = 0
    for run in a:
        va = {i["id"]: i["value"] for i in a[run]["details"]["items"] if i["source"] == "judge"}
        vb = {i["id"]: i["value"] for i in b[run]["details"]["items"] if i["source"] == "judge"}
        if "s1a" in va and "s1a" in vb:
            total += 1
            same += va["s1a"] == vb["s1a"]
    s1a = next(i for i in out["items"] if i["item"] == "s1a")
    assert out["runs"] == 4 and s1a["units"] == total and s1a["agreement"] == pytest.approx(same / total)
    assert out == {**out, **agreement_table([list(a.values()), list(b.values())])}
    r = runner.invoke(
        cli, ["judge", "compare", "--store", str(store), "--a", "nobody", "--b", "llm:fake-judge"]
    )
    assert r.exit_code != 0 and "no rows from judge 'nobody'" in r.output
    # The report shows the judge's stability over the repeats (terminal and HTML).
    page = tmp_path / "r.html"
    r = runner.invoke(
        cli, ["report", "--store", str(store), "--judge", "llm:fake-judge", "--html", str(page)], env=env
    )
    assert r.exit_code == 0, r.output
    assert "judge stability over 3 repeats" in r.output
    assert "Judge stability over 3 repeats" in page.read_text()
