"""``amb export atif`` / ``amb import atif``: valid for Harbor's validator and the ``atif`` package,
stable through export → import → export, and an imported run scores as the original."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from agents.baseline.server import BaselineServer
from amb.main import cli
from recorder.synthetic import generate_run
from replay.ingest import ingest
from tests.fakes.baseline_run import record_baseline_run
from tests.recorder.importers import amb_fixtures as fx
from tests.replay.export_helpers import export_of_a_big_run, harbor_validator_class


def amb(*args: str):
    return CliRunner().invoke(cli, list(args), env={"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": ""})


DEMO_TASKS = ("kidney-seg", "ldct-denoising", "vqa-rad", "mimic-cxr-report", "bccd-det")
"""One task per track, as in amb/demo-sweep.toml: every kind of run the demo records."""


def record_demo_run(
    root: Path, tmp: Path, server: BaselineServer, task: str, model: str = "baseline", tier: str = "standard"
) -> str:
    """A run as the demo records it, on the task's synthetic twin; ``model`` names the baseline's
    policy (``baseline+crash-mid-batch`` is the demo's flawed agent). Its spools wait for the store's
    one ingest."""
    data = fx.twin(task, tmp, cases=2)
    run_id = f"demo-{task}-{tier}" + ("-crash" if "crash" in model else "")
    proc = record_baseline_run(
        root,
        server.url,
        data,
        tmp / f"ws-{run_id}",
        task=task,
        tier=tier,
        run_id=run_id,
        model=model,
        record_args=("--no-ingest",),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """Runs recorded as the demo records them (every track; the flawed agent and the lite tier
    once each), two synthetic runs (three sources each, through the real spool path) and one
    imported AutoMedBench run."""
    tmp = tmp_path_factory.mktemp("atif")
    root = tmp / "store"
    # The imported run's folder first: it makes the kidney twin with the three cases it expects.
    seg = fx.seg_local(tmp / "src", "kidney-seg", "kidney", tmp, drop=1)
    demo_runs = [(task, "baseline", "standard") for task in DEMO_TASKS]
    demo_runs.append(("kidney-seg", "baseline+crash-mid-batch", "lite"))
    for task in DEMO_TASKS:
        fx.twin(task, tmp, cases=2)
    # Two at a time: a run is mostly its processes starting, and each writes only its own spools.
    with BaselineServer() as server, ThreadPoolExecutor(2) as pool:
        recorded = list(pool.map(lambda r: record_demo_run(root, tmp, server, *r), demo_runs))
    for i in range(2):
        generate_run(root, f"rec-{i}", seed=i, calls=6)
    ingest(root)
    r = amb("import", "automedbench", "--store", str(root), "--json", str(seg))
    assert r.exit_code == 0, r.output
    runs = [*recorded, "rec-0", "rec-1", json.loads(r.stdout)[0]["run_id"]]
    return root, tmp / "data", runs


@pytest.fixture(scope="module")
def exported(store, tmp_path_factory) -> dict[str, Path]:
    root, _, runs = store
    out = tmp_path_factory.mktemp("out")
    folders = {}
    for version in ("1.8", "1.6"):
        r = amb(
            "export",
            "atif",
            "--store",
            str(root),
            "--all",
            "--version",
            version,
            "--out",
            str(out / version),
            "--json",
        )
        assert r.exit_code == 0, r.output
        assert sorted(w["run_id"] for w in json.loads(r.output)) == sorted(runs)
        folders[version] = out / version
    return folders


@pytest.mark.parametrize("version", ["1.8", "1.6"])
def test_harbor_validator_accepts_every_run(exported, store, version):
    validator_class = harbor_validator_class()
    for run in store[2]:
        path = exported[version] / run / "trajectory.json"
        doc = json.loads(path.read_text())
        assert doc["schema_version"] == f"ATIF-v{version}"
        assert ("llm_call_count" in json.dumps(doc)) == (version == "1.8")
        v = validator_class()
        assert v.validate(str(path)), v.get_errors()


def test_atif_package_accepts_every_run(exported, store):
    from atif import Trajectory

    for run in store[2]:
        doc = json.loads((exported["1.8"] / run / "trajectory.json").read_text())
        t = Trajectory.model_validate(doc)
        assert len(t.steps) == doc["final_metrics"]["total_steps"]


def test_step_mapping(exported, store):
    """The synthetic run's 6 calls: system + user step, then one agent step per call with tool
    calls as objects, observations paired by id, and cached tokens in the metrics."""
    doc = json.loads((exported["1.8"] / "rec-0" / "trajectory.json").read_text())
    sources = [s["source"] for s in doc["steps"]]
    assert sources == ["system", "user"] + ["agent"] * 6
    agent_steps = doc["steps"][2:]
    assert all(isinstance(tc["arguments"], dict) for s in agent_steps for tc in s["tool_calls"])
    # Every tool result but the last (the run ends on submit) comes back as an observation.
    observed = [r["source_call_id"] for s in agent_steps for r in s.get("observation", {}).get("results", [])]
    asked = [tc["tool_call_id"] for s in agent_steps for tc in s["tool_calls"]]
    assert observed == asked[:-1]
    con = duckdb.connect(str(store[0] / "amb.duckdb"), read_only=True)
    cached = con.execute("SELECT sum(cache_read_tokens) FROM model_calls WHERE run_id = 'rec-0'").fetchall()[
        0
    ][0]
    con.close()
    assert doc["final_metrics"]["total_cached_tokens"] == cached > 0
    side = (exported["1.8"] / "rec-0" / "events.jsonl").read_text().splitlines()
    kinds = {json.loads(x)["kind"] for x in side}
    assert {"run.started", "run.finished", "process.exited", "file.written", "submission.sealed"} <= kinds


def _scores(root: Path, refs: Path, profile: str, runs: list[str]) -> dict[str, dict]:
    r = amb("score", "--store", str(root), *runs, "--profile", profile, "--references", str(refs), "--json")
    assert r.exit_code == 0, r.output
    keep = ("s1", "s2", "s3", "s4", "s5", "agentic", "task_score", "overall", "status", "cost")
    out = {}
    for row in json.loads(r.output)["rows"]:
        codes = sorted(c["code"] if isinstance(c, dict) else str(c) for c in row.get("codes") or [])
        out[row["run_id"]] = {**{k: row.get(k) for k in keep}, "codes": codes}
    return out


def test_roundtrip_is_stable_and_scores_the_same(exported, store, tmp_path):
    root, refs, runs = store
    fresh = tmp_path / "fresh"
    folders = [str(exported["1.8"] / r) for r in runs]
    r = amb("import", "atif", "--store", str(fresh), "--json", *folders)
    assert r.exit_code == 0, r.output
    assert [x["status"] for x in json.loads(r.stdout)] == ["imported"] * len(runs)
    assert sorted(x["run_id"] for x in json.loads(r.stdout)) == sorted(runs)
    assert amb("verify", "--store", str(fresh)).exit_code == 0
    again = tmp_path / "again"
    r = amb("export", "atif", "--store", str(fresh), "--all", "--out", str(again))
    assert r.exit_code == 0, r.output
    for run in runs:
        for name in ("trajectory.json", "events.jsonl"):
            assert (again / run / name).read_bytes() == (exported["1.8"] / run / name).read_bytes(), (
                run,
                name,
            )
    # Re-import adds nothing.
    r = amb("import", "atif", "--store", str(fresh), "--json", *folders)
    assert {x["status"] for x in json.loads(r.stdout)} == {"skipped"}
    # Scored: two recorded tracks, the synthetic and the imported runs (scoring every demo track
    # twice under two profiles would add minutes, the report track's METEOR above all).
    scored = [r for r in runs if not r.startswith("demo-") or r.split("-")[1] in ("bccd", "vqa")]
    for profile in ("paper-2026-06", "code-2026-04"):
        before, after = _scores(root, refs, profile, scored), _scores(fresh, refs, profile, scored)
        assert before == after, profile
        assert any(v["task_score"] is not None for v in before.values())


def test_foreign_trajectory_without_sidecar(exported, store, tmp_path):
    """A trajectory from elsewhere (no sidecar, no amb extras): calls, tools and tokens come in;
    what ATIF cannot carry is stated as a limitation."""
    doc = json.loads((exported["1.8"] / "rec-1" / "trajectory.json").read_text())
    for s in doc["steps"]:
        s.pop("extra", None)
    doc.pop("extra")
    doc["session_id"] = "elsewhere-1"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    fresh = tmp_path / "s"
    r = amb("import", "atif", "--store", str(fresh), "--json", str(path))
    assert r.exit_code == 0, r.output
    run = json.loads(r.stdout)[0]["run_id"]
    assert run.startswith("atif-")
    s = json.loads(amb("show", "--store", str(fresh), run, "--json").output)
    agent_steps = [x for x in doc["steps"] if x["source"] == "agent"]
    assert s["model_calls"]["count"] == len(agent_steps)
    assert s["tokens"]["cache_read"] == doc["final_metrics"]["total_cached_tokens"]
    assert sum(s["tool_calls"].values()) == sum(len(x.get("tool_calls", [])) for x in agent_steps)
    assert [x["limitation"] for x in s["limitations"]] == ["no_side_events"]
    assert s["labels"]["atif_session_id"] == "elsewhere-1"


HOSTILE = {
    "bad-json": ("{not json", "not JSON"),
    "not-atif": (json.dumps({"schema_version": "other", "agent": {}, "steps": [{}]}), "is not ATIF v1.x"),
    "traversal-image": (
        json.dumps(
            {
                "schema_version": "ATIF-v1.8",
                "agent": {"name": "a", "version": "1"},
                "steps": [
                    {
                        "step_id": 1,
                        "source": "user",
                        "message": [
                            {
                                "type": "image",
                                "source": {"media_type": "image/png", "path": "../../etc/x.png"},
                            }
                        ],
                    }
                ],
            }
        ),
        "leaves the trajectory's folder",
    ),
    "string-arguments": (
        json.dumps(
            {
                "schema_version": "ATIF-v1.8",
                "agent": {"name": "a", "version": "1"},
                "steps": [
                    {
                        "step_id": 1,
                        "source": "agent",
                        "message": "",
                        "tool_calls": [{"tool_call_id": "x", "function_name": "f", "arguments": "rm -rf /"}],
                    }
                ],
            }
        ),
        "steps[0].tool_calls[0].arguments: Expected `object | null`, got `str`",
    ),
}


@pytest.mark.parametrize("kind", [*HOSTILE, "sidecar-blob-missing", "sidecar-blob-swapped", "huge-line"])
def test_hostile_trajectories_are_rejected(exported, tmp_path, kind):
    store = tmp_path / "store"
    assert amb("import", "atif", "--store", str(store), str(exported["1.8"] / "rec-0")).exit_code == 0
    before = sorted(str(p) for p in store.rglob("*"))
    extra: list[str] = []
    if kind in HOSTILE:
        target = tmp_path / "in" / "trajectory.json"
        target.parent.mkdir()
        target.write_text(HOSTILE[kind][0])
        expect = HOSTILE[kind][1]
    else:
        folder = tmp_path / "in"
        shutil.copytree(exported["1.8"] / "rec-1", folder)
        target = folder
        blobs = sorted((folder / "blobs").iterdir())
        if kind == "sidecar-blob-missing":
            blobs[0].unlink()
            expect = "/in/blobs/"  # the folder given, named in full
        elif kind == "sidecar-blob-swapped":
            blobs[0].write_bytes(b"something else")
            expect = "content does not match its name"
        else:
            with open(folder / "events.jsonl", "a") as f:
                f.write(
                    json.dumps({"kind": "note", "v": 2, "ts_ns": 1, "payload": {"text": "x" * 9000}}) + "\n"
                )
            extra = ["--max-line-bytes", "8192"]
            expect = "longer than the 8192-byte line cap"
    r = amb("import", "atif", "--store", str(store), "--json", *extra, str(target))
    assert r.exit_code == 2, r.output
    row = json.loads(r.stdout)[0]
    assert row["status"] == "rejected" and expect in row["detail"], row
    assert sorted(str(p) for p in store.rglob("*")) == before


def test_anthropic_and_responses_requests_map_to_atif(tmp_path):
    """Request bodies of the other two wire formats: Anthropic's top-level ``system`` and
    ``input_schema`` tools, its tool results inside user messages (not user steps), and the
    Responses API's ``instructions``/``input``."""
    from recorder.importers.common import RunBuilder, write
    from schemas.events import AssistantMessage, ModelCallCompleted, RunStarted, ToolCallPart, Usage

    b = RunBuilder("anthropic-1")
    b.emit(RunStarted(agent="claude-agent", model="claude-x", backend="local"), 1_000)
    tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}]
    first = {
        "model": "claude-x",
        "system": [{"type": "text", "text": "Be careful."}],
        "tools": tools,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Segment the kidney."}]}],
    }
    second = {
        **first,
        "messages": [
            *first["messages"],
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "tu1", "name": "bash", "input": {}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "ok"}]},
            {"role": "user", "content": "Hurry up."},
        ],
    }
    third = {"model": "gpt-x", "instructions": "Be brief.", "input": "And now?", "tools": []}
    for i, (req, api, provider) in enumerate(
        [(first, "messages", "anthropic"), (second, "messages", "anthropic"), (third, "responses", "openai")]
    ):
        calls = [ToolCallPart(id="tu1", name="bash", arguments="{}")] if i == 0 else []
        b.emit(
            ModelCallCompleted(
                call_id=f"c{i}",
                provider=provider,
                api=api,
                model="claude-x",
                request=b.json_blob(req, "application/json"),
                message=AssistantMessage(text=f"t{i}", tool_calls=calls),
                usage=Usage(input_total=100, cache_read=60, cache_write=10, output=5),
                started_ns=2_000 + i,
            ),
            2_000 + i,
        )
    store = tmp_path / "s"
    write(store, b)
    ingest(store)
    out = tmp_path / "out"
    assert amb("export", "atif", "--store", str(store), "anthropic-1", "--out", str(out)).exit_code == 0
    doc = json.loads((out / "anthropic-1" / "trajectory.json").read_text())
    assert doc["agent"]["tool_definitions"] == [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "run",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    assert [(s["source"], s["message"]) for s in doc["steps"]] == [
        ("system", "Be careful."),
        ("user", "Segment the kidney."),
        ("agent", "t0"),
        ("user", "Hurry up."),
        ("agent", "t1"),
        ("user", "And now?"),
        ("agent", "t2"),
    ]
    assert doc["steps"][2]["metrics"]["cached_tokens"] == 60
    v = harbor_validator_class()()
    assert v.validate(str(out / "anthropic-1" / "trajectory.json")), v.get_errors()


def test_a_gemini_run_maps_to_atif(tmp_path, genai_run):
    """A google-genai run's Gemini calls: the user's turns from ``contents``, the declared functions
    from ``functionDeclarations``, each function call with its response as the observation."""
    out = tmp_path / "out"
    r = amb("export", "atif", "--store", str(genai_run.store), genai_run.run_id, "--out", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads((out / genai_run.run_id / "trajectory.json").read_text())
    assert [t["function"]["name"] for t in doc["agent"]["tool_definitions"]] == ["read_file"]
    users = [s["message"] for s in doc["steps"] if s["source"] == "user"]
    assert users[:2] == ["read notes.md", "list the files"]
    first = next(s for s in doc["steps"] if s.get("tool_calls"))
    assert first["tool_calls"][0]["function_name"] == "read_file"
    assert first["observation"]["results"][0]["content"] == "notes: ok"
    v = harbor_validator_class()()
    assert v.validate(str(out / genai_run.run_id / "trajectory.json")), v.get_errors()


def test_export_of_a_big_run_holds_about_its_output_not_its_events(tmp_path):
    """A run of tens of thousands of events, most of them for the sidecar: each is encoded as it
    is read, so the export takes about the memory of what it writes (the run's events as objects,
    then as dicts, took six times that: 1.3 GB for a run of 400,000 events)."""
    out = tmp_path / "out"
    r, peak = export_of_a_big_run(tmp_path, "atif", "many", "--out", str(out))
    assert r.exit_code == 0, r.output
    sidecar = (out / "many" / "events.jsonl").read_bytes().splitlines()
    assert len(sidecar) > 10_000 and all(json.loads(line)["kind"] for line in sidecar)
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert peak < 4 * written, (peak, written)
