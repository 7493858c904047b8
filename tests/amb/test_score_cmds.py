"""`amb score`, `amb report`, `amb audit` through the real CLI on a real store."""

from __future__ import annotations

import json

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
