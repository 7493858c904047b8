"""``amb import automedbench``: every branch's layout imports, scores, verifies; hostile folders are refused.

Fixtures are built by hand from each branch's writer code (``amb_fixtures``); none of the source
loops can run here (they need conda envs, GPUs and OpenRouter).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from amb.main import cli
from replay.store import Store
from tests.recorder.importers import amb_fixtures as fx


def amb(*args: str):
    return CliRunner().invoke(cli, list(args), env={"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": ""})


def sql(store: Path, query: str) -> list[tuple]:
    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("amb-runs")
    out = tmp / "src"
    return {
        "seg": fx.seg_local(out, "kidney-seg", "kidney", tmp),
        "seg-final-answer": fx.seg_local(
            out, "kidney-seg", "kidney", tmp, final_answer_without_tools=True, drop=1, tag="260412-0000ff"
        ),
        "det2d": fx.seg_local(out, "bccd-det", "bccd", tmp, det=True, tag="260412-d00d00"),
        "seg-docker-breach": fx.seg_docker_breach(out, "kidney-seg", tmp),
        "vqa": fx.vqa(out, "vqa-rad", tmp),
        "report": fx.report_gen(out, "mimic-cxr-report", tmp),
        "enhancement": fx.enhancement(out, "ldct-denoising", tmp),
        "_data": tmp / "data",
    }


@pytest.fixture(scope="module")
def imported(folders, tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    store = tmp_path_factory.mktemp("store") / "s"
    names = [k for k in folders if not k.startswith("_")]
    r = amb("import", "automedbench", "--store", str(store), "--json", *(str(folders[k]) for k in names))
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["status"] for row in rows] == ["imported"] * len(names)
    return store, {k: row for k, row in zip(names, rows, strict=True)}


def test_the_runs_of_one_import_share_one_pack(imported):
    store, _ = imported
    assert len(list((store / "blobs" / "packs").glob("*.pack"))) == 1


EXPECTED = {
    # name: (branch, task, model calls = the source's count of API calls, limitations)
    "seg": ("seg", "kidney-seg", 4, {"approximate_clock", "cut_tool_output"}),
    "seg-final-answer": (
        "seg",
        "kidney-seg",
        4,
        {"approximate_clock", "cut_tool_output", "missing_last_assistant_turn"},
    ),
    "det2d": ("det2d", "bccd-det", 4, {"approximate_clock", "cut_tool_output"}),
    "seg-docker-breach": (
        "seg",
        "kidney-seg",
        2,
        {"approximate_clock", "cut_tool_output", "missing_conversation", "no_outputs"},
    ),
    "vqa": ("vqa", "vqa-rad", 3, {"approximate_clock", "cut_tool_output", "missing_system_prompt"}),
    "report": ("report", "mimic-cxr-report", 2, {"approximate_clock"}),
    "enhancement": (
        "enhancement",
        "ldct-denoising",
        3,
        {"approximate_clock", "cut_tool_output", "running_total_tokens"},
    ),
}


def source_api_calls(run: Path) -> int:
    """The source's own count of API calls, from whichever file of its layout keeps it."""
    proc = run / "workspace" / "process" if (run / "workspace").is_dir() else run / "process"
    if (proc / "agent_summary.json").is_file():
        return json.loads((proc / "agent_summary.json").read_text())["n_api_calls"]
    if (proc / "api_responses.jsonl").is_file():
        return len((proc / "api_responses.jsonl").read_text().splitlines())
    conv = proc / "conversation.json"
    if conv.is_file() and "api_calls" in json.loads(conv.read_text()):
        return json.loads(conv.read_text())["api_calls"]
    trace = [json.loads(x) for x in (proc / "trace.jsonl").read_text().splitlines()]
    ends = [r["api_calls"] for r in trace if r.get("type") == "run_end"]
    return ends[0] if ends else sum(1 for r in trace if r.get("type") == "api_call")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_layout_imports_with_its_limitations(imported, name):
    store, rows = imported
    run = rows[name]["run_id"]
    branch, task, calls, limitations = EXPECTED[name]
    r = amb("show", "--store", str(store), run, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["task"] == task and s["backend"] == "import" and s["labels"]["branch"] == branch
    assert s["model_calls"]["count"] == calls == source_api_calls(Path(rows[name]["input"]))
    assert {lim["limitation"] for lim in s["limitations"]} == limitations
    text = amb("show", "--store", str(store), run).output
    assert "limited   approximate_clock" in text
    # Every event is under source `import`, every body is marked synthetic.
    assert sql(store, f"SELECT DISTINCT source FROM events WHERE run_id = '{run}'") == [("import",)]
    media = sql(
        store,
        f"SELECT DISTINCT payload->>'$.request.media_type' FROM events "
        f"WHERE run_id = '{run}' AND kind = 'model_call.completed'",
    )
    assert media == [("application/vnd.amb.synthetic+json",)]


def test_tokens_and_tool_pairs(imported):
    store, rows = imported
    enh = rows["enhancement"]["run_id"]
    # Running totals 1000, 3000, 6000 become per-call counts 1000, 2000, 3000.
    got = sql(store, f"SELECT input_tokens FROM model_calls WHERE run_id = '{enh}' ORDER BY seq")
    assert [g[0] for g in got] == [1000, 2000, 3000]
    seg = rows["seg"]["run_id"]
    pairs = sql(
        store,
        f"""SELECT count(*) FILTER (WHERE kind = 'tool_call.requested'),
                   count(*) FILTER (WHERE kind = 'tool_call.result'),
                   count(*) FILTER (WHERE kind = 'process.exited')
            FROM events WHERE run_id = '{seg}'""",
    )
    assert pairs == [(4, 4, 3)]
    final = rows["seg-final-answer"]["run_id"]
    partial = sql(
        store,
        f"SELECT payload->>'$.partial', payload->>'$.message.text' FROM events "
        f"WHERE run_id = '{final}' AND kind = 'model_call.completed' ORDER BY seq DESC LIMIT 1",
    )
    assert partial == [("true", "All masks are written. I am done.")]


def test_reimport_adds_nothing_and_verify_passes(imported, folders):
    store, rows = imported
    before = sql(store, "SELECT count(*), max(hash) FROM events")
    names = [k for k in folders if not k.startswith("_")]
    r = amb("import", "automedbench", "--store", str(store), "--json", *(str(folders[k]) for k in names))
    assert r.exit_code == 0, r.output
    assert {row["status"] for row in json.loads(r.stdout)} == {"skipped"}
    assert sql(store, "SELECT count(*), max(hash) FROM events") == before
    r = amb("verify", "--store", str(store))
    assert r.exit_code == 0 and r.output.startswith("OK"), r.output


def test_breach_and_origin_scores(imported):
    store, rows = imported
    breach = rows["seg-docker-breach"]["run_id"]
    status = sql(store, f"SELECT status FROM runs WHERE run_id = '{breach}'")
    assert status == [("failed",)]
    kinds = sql(
        store,
        f"SELECT payload->>'$.data.violation' FROM events WHERE run_id = '{breach}' "
        "AND payload->>'$.data.kind' = 'amb.import.violation' ORDER BY seq",
    )
    assert kinds == [("violation_warning",), ("isolation_breach",)]
    seg = rows["seg"]["run_id"]
    origin = sql(
        store,
        f"SELECT payload->>'$.data.path', payload->>'$.data.clinical_score' FROM events "
        f"WHERE run_id = '{seg}' AND payload->>'$.data.kind' = 'origin_scores'",
    )
    assert origin == [("detail_report.json", "1.0")]


@pytest.mark.parametrize("name", ["seg", "seg-final-answer", "det2d", "vqa", "enhancement"])
def test_task_equals_the_source_clinical_score(imported, folders, name):
    """Where our grader's formula and the source's agree (perfect submissions; a seg run with one
    case's masks missing, zero under the code's all-or-nothing rule), TASK = the source's score.
    Report generation is left out: the source's report score is an LLM-judged blend ours is not."""
    store, rows = imported
    run = rows[name]["run_id"]
    r = amb(
        "score",
        "--store",
        str(store),
        run,
        "--profile",
        "code-2026-04",
        "--references",
        str(folders["_data"]),
        "--json",
    )
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)["rows"][0]
    source = sql(
        store,
        "SELECT coalesce(payload->>'$.data.clinical_score', payload->>'$.data.task_score', "
        "payload->>'$.data.scores.mean_ssim') FROM events "
        f"WHERE run_id = '{run}' AND payload->>'$.data.kind' = 'origin_scores'",
    )
    assert row["task_score"] == pytest.approx(float(source[0][0]), abs=1e-9)


def test_benchmark_task_ids_resolve_everywhere():
    from tasks.registry import brief, canonical_id, load_spec

    assert load_spec("kidney-seg-task").id == "kidney-seg" and canonical_id("kidney") == "kidney-seg"
    assert brief("vqa-rad-task", "lite") == brief("vqa-rad", "lite")
    r = amb("task", "show", "ldct-denoising-task", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["id"] == "ldct-denoising"


def _store_state(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*")) if store.exists() else []


def _hostile(tmp: Path, folders: dict[str, Path], kind: str) -> tuple[Path, list[str]]:
    import shutil

    run = tmp / kind / "260101-abcdef"
    shutil.copytree(folders["seg"], run, symlinks=True)
    extra: list[str] = []
    if kind == "bad-json":
        with open(run / "process" / "trace.jsonl", "a") as f:
            f.write('{"ts": 1, "type": "api_call", \n')
    elif kind == "huge-line":
        with open(run / "process" / "trace.jsonl", "a") as f:
            f.write(json.dumps({"type": "note", "pad": "x" * 5000}) + "\n")
        extra = ["--max-line-bytes", "4096"]
    elif kind == "symlink-out":
        target = run / "outputs" / "agents_outputs" / "case_00000" / "organ.nii.gz"
        target.unlink()
        target.symlink_to("/etc/passwd")
    elif kind == "symlinked-dir-out":
        (run / "outputs" / "plan" / "escape").symlink_to("/etc", target_is_directory=True)
    elif kind == "traversal-task":
        conv = json.loads((run / "process" / "conversation.json").read_text())
        conv["task"] = "../../../etc/passwd"
        (run / "process" / "conversation.json").write_text(json.dumps(conv))
        (run / "detail_report.json").unlink()
        shutil.move(str(run), str(tmp / kind / "x"))
        run = tmp / kind / "x"
    elif kind == "unknown-layout":
        shutil.rmtree(run / "process")
    elif kind == "conversation-not-object":
        (run / "process" / "conversation.json").write_text('"just a string"')
    elif kind == "deep-json-line":  # a decoder recurses once per level: RecursionError, not ValueError
        with open(run / "process" / "trace.jsonl", "a") as f:
            f.write('{"type": "note", "x": ' + "[" * DEEP + "]" * DEEP + "}\n")
    elif kind == "deep-json-file":
        (run / "process" / "conversation.json").write_text("[" * DEEP + "]" * DEEP)
    return run, extra


DEEP = 100_000


HOSTILE = {
    "bad-json": "trace.jsonl: line 10: not JSON",
    "huge-line": "longer than the 4096-byte line cap",
    "symlink-out": "organ.nii.gz: links outside the folder",
    "symlinked-dir-out": "plan/escape: links outside the folder",
    "traversal-task": "is not a task id",
    "unknown-layout": "unknown layout",
    "conversation-not-object": "neither a message list nor an object",
    "deep-json-line": "trace.jsonl: line 10: not JSON (nested 100001 levels deep; at most 200",
    "deep-json-file": "conversation.json: not JSON (nested 100000 levels deep; at most 200",
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_folders_are_rejected_and_leave_the_store_untouched(folders, tmp_path, kind):
    store = tmp_path / "store"
    ok = amb("import", "automedbench", "--store", str(store), str(folders["report"]))
    assert ok.exit_code == 0, ok.output
    before = _store_state(store)
    run, extra = _hostile(tmp_path, folders, kind)
    r = amb("import", "automedbench", "--store", str(store), "--json", *extra, str(run))
    assert r.exit_code == 2  # bad input
    rows = json.loads(r.stdout)
    assert rows[0]["status"] == "rejected" and HOSTILE[kind] in rows[0]["detail"], rows
    assert f"amb: error: {rows[0]['detail']}\n" in r.stderr and "Traceback" not in r.output
    assert _store_state(store) == before


def test_deeply_nested_json_the_agent_wrote_is_text_not_a_rejection(folders, tmp_path):
    """A tool's output nested 100,000 deep (what the agent printed), and a rescored report beside
    the harness's with the same nesting: the run imports, the output kept as the text it is (not
    an error), the report kept as a file with no scores read from it, and verifies."""
    import shutil

    run = tmp_path / "deep" / "260101-abcdef"
    shutil.copytree(folders["seg"], run, symlinks=True)
    conv_path = run / "process" / "conversation.json"
    conv = json.loads(conv_path.read_text())
    messages = conv if isinstance(conv, list) else conv["messages"]
    tool = next(m for m in messages if m.get("role") == "tool")
    deep = "[" * DEEP + "]" * DEEP
    tool["content"] = deep
    conv_path.write_text(json.dumps(conv))
    (run / "detail_report_new-rubrics.json").write_text('{"task_score": ' + deep + "}")
    store = tmp_path / "store"
    r = amb("import", "automedbench", "--store", str(store), "--json", str(run))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)[0]["status"] == "imported" and "Traceback" not in r.output
    with Store.open(store, read_only=True) as st:
        outputs = st.con.execute(
            "SELECT payload->>'is_error', payload->>'output', payload->'output_blob'->>'size' "
            "FROM events WHERE kind = 'tool_call.result'"
        ).fetchall()
    kept = [o for o in outputs if o[1] == deep or o[2] == str(len(deep))]
    assert len(kept) == 1 and kept[0][0] == "false", outputs
    assert amb("verify", "--store", str(store)).exit_code == 0


def test_recursive_finds_every_run_folder(folders, tmp_path):
    """``-r`` over a tree of runs (the branches' own runs/<tier>/<agent>/<task>/<tag> nesting)
    finds each run folder once; the VQA folder's links to question folders are not followed."""
    src = folders["seg"].parents[4]
    r = amb("import", "automedbench", "-r", "--store", str(tmp_path / "s"), "--json", str(src))
    assert r.exit_code == 0, r.output
    found = sorted(Path(x["input"]).resolve() for x in json.loads(r.stdout))
    expected = sorted(p.resolve() for k, p in folders.items() if not k.startswith("_"))
    assert found == expected
