"""`amb report --diff-profiles A B`: per run, which options changed which numbers."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from amb.main import cli
from scorer.profile import load
from scorer.profile_diff import changed_options

ENV = {"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": ""}


@pytest.fixture(scope="module")
def store(synthetic_store):
    return str(synthetic_store("diff", 8, 8))


def amb(*args):
    return CliRunner().invoke(cli, list(args), env=ENV)


def test_changed_options_per_track():
    paper, code = load("paper-2026-06").profile, load("code-2026-04").profile
    seg = changed_options(paper, code, "segmentation")
    assert seg["stages.null_policy"] == ("renormalise", "zero")
    assert seg["metrics.completeness"] == ("per_case_zero", "all_or_nothing_missing")
    vqa = changed_options(paper, code, "vqa")
    assert "stages.null_policy" not in vqa and vqa["stages.round_digits"] == (None, 4)
    assert changed_options(paper, paper, "vqa") == {}


def test_diff_profiles(store):
    r = amb("report", "--store", store, "--diff-profiles", "paper-2026-06", "code-2026-04")
    assert r.exit_code != 0 and "no scores" in r.output
    rows = {}
    for profile in ("paper-2026-06", "code-2026-04"):
        r = amb("score", "--store", store, "--all", "--profile", profile, "--json")
        assert r.exit_code == 0, r.output
        rows[profile] = {x["run_id"]: x for x in json.loads(r.output)["rows"]}
    r = amb("report", "--store", store, "--diff-profiles", "paper-2026-06", "code-2026-04", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["runs_compared"] == 8 and out["runs_in_one_only"] == []
    changes = {(c["run_id"], c["field"]): c for c in out["changes"]}
    # Every AGENTIC that differs is listed, with the values of both rows.
    for run, a in rows["paper-2026-06"].items():
        b = rows["code-2026-04"][run]
        key = (run, "agentic")
        if a["agentic"] != b["agentic"]:
            assert changes[key]["a"] == a["agentic"] and changes[key]["b"] == b["agentic"]
            opts = changes[key]["options"]
            # Without references S4 and S5 are unscored: zero (seg, det, report) vs renormalise.
            if a["track"] in ("segmentation", "detection", "report"):
                assert "stages.null_policy" in opts
            else:
                assert "stages.null_policy" not in opts and "stages.round_digits" in opts
            assert not any(o.startswith("judge.") for o in opts)  # offline judge: settings unused
        else:
            assert key not in changes
    assert any(f == "agentic" for _, f in changes)
    r = amb("report", "--store", store, "--diff-profiles", "paper-2026-06", "code-2026-04")
    assert r.exit_code == 0 and "changed numbers" in r.output and "stages.null_policy" in r.output
