"""Budgets at the proxy, end to end: ``amb-record --max-calls/--max-tokens/--max-cost`` with agents on
the newest openai and anthropic SDKs (their own venv) against the loopback fake upstream, which
counts the requests that reach it.

For each limit and both SDKs: the agent's SDK raises its provider's quota error carrying amb's
message (once: the SDK does not retry it), the run is ``budget_exceeded`` with its reason, exactly
the calls before the limit reached the upstream, the refusal is recorded, and the cost amb-record
recorded is the one ``amb score`` computes. Then the hostile cases: an agent that retries forever
(stopped, still nothing more upstream) and calls racing across the limit from many threads.

The fake's usage per call (tests/fakes/upstream.py): Chat Completions 120 in + 30 out = 150 tokens;
Responses 200 + 40; Messages 30 + 400 cache read + 70 cache write in, 25 out = 525 tokens.
Prices (openrouter-2026-05-28): gpt-5.4 $2.50/$15, claude-opus-4.6 $5/$25 per 1M tokens, cached
input at the input price.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replay.store import Store
from tests.fakes.agents import agents_python
from tests.fakes.record_cli import amb_record

AGENT = Path(__file__).parents[1] / "fakes" / "agents" / "budget_agent.py"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def agents_py() -> Path:
    return agents_python()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("budget") / "store"


def record(
    store: Path, fake_url: str, ws: Path, python: Path, agent: list[str], *flags: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """amb-record running budget_agent.py; a careful agent gets a long --grace to end on its own (on a
    loaded machine it may take seconds), the hostile test passes its own."""
    ws.mkdir(parents=True, exist_ok=True)
    if "--grace" not in flags:
        flags = ("--grace", "120", *flags)
    return amb_record(
        store, fake_url, [str(python), str(AGENT), *agent], cwd=ws, extra=flags, timeout=timeout
    )


def amb_json(store: Path, *args: str) -> object:
    r = subprocess.run(
        [str(BIN / "amb"), *args, "--store", str(store)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def query(store: Path, sql: str, *params: object) -> list[tuple]:
    """Rows of the store amb-record ingested into, read in this process (an `amb sql` process per
    test cost seconds of imports)."""
    with Store.open(store, read_only=True) as st:
        return st.con.execute(sql, list(params)).fetchall()


def outcome(store: Path, run_id: str) -> tuple[dict, list[dict]]:
    """The run's ``run.finished`` payload and its model calls (``ok``, ``status``, ``error``) in order."""
    rows = query(
        store,
        "SELECT kind, payload FROM events WHERE run_id = ? "
        "AND kind IN ('run.finished', 'model_call.completed') ORDER BY source, seq",
        run_id,
    )
    payloads = [(kind, json.loads(payload)) for kind, payload in rows]
    (end,) = [p for k, p in payloads if k == "run.finished"]
    calls = [
        {k: p[k] for k in ("ok", "status", "error")} for kind, p in payloads if kind == "model_call.completed"
    ]
    return end, calls


# (flag, value, provider, api, calls that reach the upstream, the limit's name)
LIMITS = [
    ("--max-calls", "3", "openai", "chat", 3, "max_calls"),
    ("--max-calls", "2", "anthropic", "messages-stream", 2, "max_calls"),
    # 150, 300, 450 tokens: the third call crosses 400 and completes; the fourth is refused.
    ("--max-tokens", "400", "openai", "chat-stream", 3, "max_tokens"),
    ("--max-tokens", "1200", "anthropic", "messages", 3, "max_tokens"),
    # $0.0011 per call (200·2.5 + 40·15 per 1M): the second reaches $0.0022 ≥ $0.002.
    ("--max-cost", "0.002", "openai", "responses-stream", 2, "max_cost_usd"),
    # $0.003125 per call (500·5 + 25·25 per 1M): 0.003125, 0.00625, 0.009375 ≥ 0.007.
    ("--max-cost", "0.007", "anthropic", "messages-stream", 3, "max_cost_usd"),
]


@pytest.mark.parametrize(("flag", "value", "provider", "api", "forwarded", "limit"), LIMITS)
def test_limit_refuses_the_next_call(
    tmp_path, store, fake, agents_py, flag, value, provider, api, forwarded, limit
):
    before = len(fake.requests)
    res = record(store, fake.url, tmp_path / "ws", agents_py, [provider, api, "stop"], flag, value)
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip().splitlines()[-1]

    # Nothing after the limit reached the upstream.
    assert len(fake.requests) - before == forwarded

    # The agent's SDK raised its provider's quota error, with amb's message, once (no SDK retry).
    seen = json.loads((tmp_path / "ws" / "budget.json").read_text())
    assert seen["ok"] == forwarded
    (err,) = seen["errors"]
    assert err["module"] == provider and err["type"] == "RateLimitError" and err["status"] == 429
    assert "budget is exhausted" in err["message"] and flag in err["message"]
    if provider == "openai":
        assert err["code"] == "insufficient_quota"
        assert int(seen["sdk"]["openai"].split(".")[0]) >= 3
    else:
        assert err["body"]["error"]["type"] == "rate_limit_error"

    # The run ended budget_exceeded, with the limit and what was spent; the refusal is on the record.
    assert f"run {run_id}: budget_exceeded" in res.stderr
    end, rows = outcome(store, run_id)
    assert end["status"] == "budget_exceeded"
    assert end["reason"].startswith(f"budget exceeded: {flag} ")
    assert "1 later call refused" in end["reason"]
    spent = end["budget"]
    assert spent["calls"] == forwarded and spent["refused"] == 1 and spent["limit"] == limit
    assert [r["ok"] for r in rows] == [True] * forwarded + [False]
    assert rows[-1]["status"] == 429 and rows[-1]["error"].startswith("budget_exceeded: ")
    # (the recorded cost against `amb score`'s: test_recorded_costs_are_what_amb_score_computes)


def test_an_agent_that_retries_forever_is_stopped(tmp_path, store, fake, agents_py):
    before = len(fake.requests)
    res = record(
        store,
        fake.url,
        tmp_path / "ws",
        agents_py,
        ["openai", "chat", "forever"],
        "--max-calls",
        "2",
        "--grace",
        "1",
    )
    run_id = res.stdout.strip().splitlines()[-1]
    assert len(fake.requests) - before == 2
    first_error = json.loads(res.stdout.strip().splitlines()[0])
    assert first_error["type"] == "RateLimitError" and "budget is exhausted" in first_error["message"]
    end, rows = outcome(store, run_id)
    assert end["status"] == "budget_exceeded"
    assert "was still running 1s after its first refused call; stopped by SIGTERM" in end["reason"]
    assert end["budget"]["calls"] == 2 and end["budget"]["refused"] >= 2
    assert sum(r["ok"] for r in rows) == 2
    assert len(rows) - 2 == end["budget"]["refused"]  # every refusal recorded


RACES = [
    ("--max-calls", "5", "openai", "chat", 5),
    # One after the other: $0.003125, 0.00625, 0.009375 ≥ 0.007, so exactly 3 calls, however many
    # threads race (tokens are decided by the same rule: tests/recorder/test_budget.py races them).
    ("--max-cost", "0.007", "anthropic", "messages", 3),
]


@pytest.mark.parametrize(("flag", "value", "provider", "api", "forwarded"), RACES)
def test_concurrent_calls_cannot_race_past_the_limit(
    tmp_path, store, fake, agents_py, flag, value, provider, api, forwarded
):
    threads = 12
    before = len(fake.requests)
    res = record(
        store, fake.url, tmp_path / "ws", agents_py, [provider, api, "race", str(threads)], flag, value
    )
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip().splitlines()[-1]
    assert len(fake.requests) - before == forwarded
    seen = json.loads((tmp_path / "ws" / "budget.json").read_text())
    assert seen["ok"] == forwarded and len(seen["errors"]) == threads
    end, _ = outcome(store, run_id)
    assert end["status"] == "budget_exceeded" and end["budget"]["calls"] == forwarded
    assert end["budget"]["refused"] == threads


def test_bad_budgets_are_one_clear_error(tmp_path, fake):
    for flags, needle in [
        (["--max-calls", "0"], "--max-calls 0: must be greater than 0"),
        (["--max-cost", "1", "--price-table", "nope"], "price table 'nope'"),
        (["--max-cost", "1", "--model", "mystery-model"], "model 'mystery-model' has no price"),
    ]:
        res = record(
            tmp_path / "store",
            fake.url,
            tmp_path / "ws",
            Path(sys.executable),
            ["openai", "chat", "stop"],
            *flags,
        )
        assert res.returncode == 2, (flags, res.stderr)
        assert needle in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "ws" / "budget.json").exists()  # the agent never started


def test_profiles_say_how_a_run_over_budget_is_scored(tmp_path, store, fake, agents_py):
    res = record(store, fake.url, tmp_path / "ws", agents_py, ["openai", "chat", "stop"], "--max-calls", "1")
    run_id = res.stdout.strip().splitlines()[-1]
    rows = {}
    # Scored in this process, through the scorer's entry point that `amb score` calls: two more
    # `amb score` processes would cost this module seconds of imports each.
    from scorer.batch import open_store, score_runs
    from scorer.profile import load

    with open_store(store) as st:
        for rule in ("zero", "exclude"):
            path = tmp_path / f"{rule}.toml"
            path.write_text(
                f'extends = "paper-2026-06"\n[profile]\nname = "b-{rule}"\n[budget]\nexceeded = "{rule}"\n'
            )
            (rows[rule],) = score_runs(st, load(str(path)), run_ids=[run_id], jobs=1).rows
    assert rows["zero"]["status"] == "budget_exceeded"
    assert [rows["zero"][k] for k in ("s1", "s2", "s3", "s4", "s5", "agentic", "task_score", "overall")] == [
        0.0
    ] * 8
    assert rows["zero"]["reasons"]["TASK"] == "zeroed: budget exceeded"
    assert rows["exclude"]["status"] == "budget_exceeded"
    assert [rows["exclude"][k] for k in ("s1", "agentic", "task_score", "overall")] == [None] * 4
    assert rows["exclude"]["reasons"]["OVERALL"] == "excluded: budget exceeded"
    # The cost is kept: 120 + 30 tokens of gpt-5.4 at $2.50 / $15 per 1M; the refused call used
    # nothing (and is not estimated), though it is a turn.
    for row in rows.values():
        assert row["cost_usd"] == 0.00075 and not row["cost_estimated"] and row["tokens_in"] == 120
        assert row["turns"] == 2


def test_recorded_costs_are_what_amb_score_computes(tmp_path, store, fake, agents_py):
    """Last in the module: every budgeted run of its store (and one more, with a cost budget far away
    beside --max-calls) scored by `amb score` under the default profile: the cost each run recorded
    live is the score's, to the digit."""
    res = record(
        store,
        fake.url,
        tmp_path / "ws",
        agents_py,
        ["anthropic", "messages", "stop"],
        "--max-calls",
        "4",
        "--max-cost",
        "100",
    )
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip().splitlines()[-1]
    end, _ = outcome(store, run_id)
    assert end["budget"]["calls"] == 4 and end["budget"]["cost_usd"] == pytest.approx(4 * 0.003125)
    recorded = dict(
        query(
            store,
            "SELECT run_id, payload->'budget'->>'cost_usd' FROM events WHERE kind = 'run.finished' "
            "AND payload->'budget'->>'cost_usd' IS NOT NULL",
        )
    )
    assert run_id in recorded
    out = amb_json(store, "score", *recorded, "--json")
    assert isinstance(out, dict)
    scored = {row["run_id"]: row for row in out["rows"]}
    for run, cost in recorded.items():
        assert scored[run]["cost_usd"] == float(cost), run
        assert scored[run]["price_table"] == "openrouter-2026-05-28"
