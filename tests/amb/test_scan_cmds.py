"""``amb scan`` and ``amb labels`` over the demo's runs (the offline baseline, clean and flawed, recorded
by amb-record): the scanners of docs/scanning.md, the built-in audit scanner against ``amb audit``,
an LLM scanner and the LLM judge against a loopback scripted judge, labels validated against both
judges, and bad input refused in one line."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agents.baseline.server import BaselineServer
from tasks.registry import load_spec
from tasks.synth import synth
from tests.fakes import judge_server as fake
from tests.replay.viewer_store import TASK, record_baseline
from tests.scan_checks import amb, assert_audit_scan_agrees, doc_scanners

CLEAN, FLAWED = "scan-demo-clean", "scan-demo-flawed"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("scan-demo")
    root, twin = base / "store", base / "twin" / TASK
    synth(load_spec(TASK), twin, cases=2, seed=11)
    runs = [(CLEAN, "baseline"), (FLAWED, "baseline+crash-mid-batch")]
    with BaselineServer() as server, ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda r: record_baseline(root, server, twin, base / "ws" / r[0], r[0], r[1]), runs))
    for args in (("ingest",), ("score", "--all", "--judge", "offline", "--references", str(twin.parent))):
        done = amb(*args, "--store", str(root))
        assert done.returncode == 0, done.stderr
    return root


def test_the_documented_scanners_run_over_the_demo(demo, tmp_path):
    files = [str(p) for p in doc_scanners(tmp_path) if p.suffix != ".toml"]
    done = amb("scan", *files, "--all", "--store", str(demo), "--json")
    assert done.returncode == 0, done.stderr
    tallies = {s["name"]: s for s in json.loads(done.stdout)["scanners"]}
    assert set(tallies) == {
        "inference_before_validation",
        "grader_read",
        "package_from_network",
        "claims_unwritten_file",
    }
    assert all(t["scanned"] == 2 and t["errors"] == 0 for t in tallies.values())
    again = amb("scan", *files, "--all", "--store", str(demo), "--json")
    assert all(s["scanned"] == 0 and s["skipped"] == 2 for s in json.loads(again.stdout)["scanners"])
    # `amb score` audited the runs and stored the audit scanner's rows: scanning them again adds none.
    audited = amb("scan", "audit", "--all", "--store", str(demo), "--json")
    assert [(t["scanned"], t["skipped"]) for t in json.loads(audited.stdout)["scanners"]] == [(0, 2)]
    assert_audit_scan_agrees(demo, [CLEAN, FLAWED])


def _policy(req):
    if "one recorded autonomous agent run" in req["messages"][0]["content"]:
        return fake.Reply(content='{"value": false, "explanation": "no false claim"}')
    return fake.default_policy(req)


def test_labels_validate_both_judges_and_a_scanner(demo, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "run_id,target,value,annotator\n"
        f"{CLEAN},codes,,ana\n{FLAWED},codes,E4;E5,ana\n"
        f"{CLEAN},item:s3,1,ana\n{FLAWED},item:s3,0,ana\n"
        f"{CLEAN},scanner:claims_success,false,ana\n{FLAWED},scanner:claims_success,true,ana\n"
    )
    done = amb("labels", "import", str(labels), "--name", "pilot", "--store", str(demo))
    assert done.returncode == 0, done.stderr
    offline = amb(
        "labels", "validate", "pilot", "--judge", "offline:rules-v1", "--store", str(demo), "--json"
    )
    assert offline.returncode == 0, offline.stderr
    results = {r["target"]: r for r in json.loads(offline.stdout)["results"]}
    assert {f"code:E{i}" for i in range(1, 6)} <= set(results) and "item:s3" in results
    assert all(r["runs"] == 2 for r in results.values())
    with fake.JudgeServer(_policy) as server:
        env = os.environ | {"AMB_JUDGE_BASE_URL": server.base_url, "AMB_JUDGE_MODEL": "fake-judge"}
        scored = amb("score", "--all", "--judge", "llm", "--store", str(demo), env=env)
        assert scored.returncode == 0, scored.stderr
        [toml] = [p for p in doc_scanners(tmp_path) if p.suffix == ".toml"]
        first = amb(
            "scan", str(toml), "--all", "--validate", "pilot", "--store", str(demo), "--json", env=env
        )
        assert first.returncode == 0, first.stderr
        asked = len(server.requests)
        again = amb("scan", str(toml), "--all", "--store", str(demo), "--json", env=env)
        assert json.loads(again.stdout)["model_requests"] == 0 and len(server.requests) == asked
    [v] = json.loads(first.stdout)["validation"]
    # The scripted judge says false for both runs; the labels say the flawed run is true.
    assert (v["runs"], v["agreement"], v["recall"]) == (2, 0.5, 0.0)
    assert [d["run_id"] for d in v["disagreements"]] == [FLAWED] and FLAWED in v["disagreements"][0]["link"]
    llm = amb("labels", "validate", "pilot", "--judge", "llm:fake-judge", "--store", str(demo))
    assert llm.returncode == 0, llm.stderr
    assert "code:E4" in llm.stdout and "item:s3" in llm.stdout
    report = amb("report", "--judge", "llm:fake-judge", "--store", str(demo), "--json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    shares = [s for s in data["scanners"] if s["scanner"] == "claims_success" and s["by"] == "model"]
    assert {s["group"]: (s["runs"], s["flagged"], s["share"]) for s in shares} == {
        "baseline": (1, 0, 0.0),
        "baseline+crash-mid-batch": (1, 0, 0.0),
    }
    assert {r["target"] for r in data["judge_validation"]["pilot"]} >= {"code:E4", "item:s3"}
    page = tmp_path / "report.html"
    text = amb("report", "--judge", "llm:fake-judge", "--store", str(demo), "--html", str(page))
    assert "scanners: share of runs flagged" in text.stdout and "judge against labels pilot" in text.stdout
    html = page.read_text()
    assert '<table id="scanner_shares">' in html and "claims_success" in html
    assert "Judge against labels pilot" in html and '<table id="judge_validation">' in html
    # The audit scanner's share is reported though nobody ran `amb scan audit`: scoring stored it.
    audit = [s for s in data["scanners"] if s["scanner"] == "audit" and s["by"] == "track"]
    assert audit and all(s["runs"] == 2 and s["unscanned"] == 0 for s in audit)


def test_a_store_never_scanned_says_so_in_one_line(tmp_path):
    store = tmp_path / "store"
    assert amb("generate", "--runs", "1", "--calls", "1", "--store", str(store)).returncode == 0
    assert amb("ingest", "--store", str(store)).returncode == 0
    for args in (("scan", "--errors"), ("labels", "validate", "x", "--scanner", "s")):
        done = amb(*args, "--store", str(store))
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "amb scan" in done.stderr, (
            done.stderr
        )


@pytest.mark.parametrize(
    ("args", "content", "code", "says"),
    [
        (("labels", "import", "{f}", "--name", "x"), "run_id,target,value\nr,bogus,1\n", 2, "record 1"),
        (("labels", "import", "{f}", "--name", "x"), f"run_id,target,value\n{CLEAN},codes,E9\n", 2, "E9"),
        (
            ("labels", "import", "{f}", "--name", "x"),
            "run_id,target,value\nno-such-run,codes,E1\n",
            3,
            "no run",
        ),
        (
            ("labels", "import", "{f}", "--name", "x"),
            f"run_id,target,value\n{CLEAN},scanner:s,yes\n{FLAWED},scanner:s,perhaps\n",
            2,
            "target scanner:s mixes yes/no (record 1) and text (record 2) labels",
        ),
        (("scan", "--all"), "", 2, "SCANNER"),
        (("scan", "missing.py", "--all"), "", 3, "no scanner file"),
        (("scan", "{f}", "--all"), "def broken(:\n", 2, "fails to import"),
        (("scan", "audit", "--where", "no_such_column = 1"), "", 2, "--where"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(demo, tmp_path, args, content, code, says):
    f = tmp_path / ("in.csv" if "labels" in args else "in.py")
    f.write_text(content)
    done = amb(*(a.replace("{f}", str(f)) for a in args), "--store", str(demo))
    assert done.returncode == code, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_label_set_whose_target_would_mix_kinds_refuses_the_import(demo, tmp_path):
    """Labels of one target are compared as they are: text beside yes/no (or numbers) in one set
    would compare a run's text with another's flag, so the import that would mix them is refused."""
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    first.write_text(f"run_id,target,value\n{CLEAN},item:s9,1\n")
    second.write_text(f"run_id,target,value\n{FLAWED},item:s9,looks fine\n")
    assert amb("labels", "import", str(first), "--name", "kinds", "--store", str(demo)).returncode == 0
    done = amb("labels", "import", str(second), "--name", "kinds", "--store", str(demo))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (
        f"label set 'kinds': target item:s9 holds number labels (run '{CLEAN}') and this file gives text"
        in (done.stderr)
    )
    # The same run relabelled with text replaces its number: the set then holds one kind.
    second.write_text(f"run_id,target,value\n{CLEAN},item:s9,looks fine\n")
    assert amb("labels", "import", str(second), "--name", "kinds", "--store", str(demo)).returncode == 0
