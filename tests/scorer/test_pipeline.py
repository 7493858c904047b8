"""End to end: runs recorded through the spool → ingest path, with real sealed submissions, graded
against a synthetic twin's references, scored under both profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from recorder.spool import SpoolWriter, spool_path
from replay.ingest import ingest
from schemas.blob import digest
from schemas.blobstore import BlobStore
from schemas.events import (
    AssistantMessage,
    FileWritten,
    ModelCallCompleted,
    RunFinished,
    RunStarted,
    SealedFile,
    SubmissionSealed,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
    Usage,
)
from scorer.batch import open_store, score_runs
from scorer.profile import load
from tasks.registry import load_spec
from tasks.synth import perfect_submission, synth

PLAN = (
    b"# Plan\n1. Load each CT and check spacing\n2. Run the kidney tumour model (organ and lesion "
    b"labels)\n3. Pilot on one case, inspect shape and labels\n4. Run all cases\n5. Write masks\n"
)


def record(
    store: Path, run_id: str, workspace: Path | None, drop_case: str | None = None, traceback: bool = False
) -> None:
    blobs = BlobStore(store / "blobs")
    w = SpoolWriter(spool_path(store, run_id, "recorder"), run_id, "recorder", sync=False)
    ts = [1_790_000_000_000_000_000]

    def emit(p):
        ts[0] += 1_000_000_000
        w.append(p, ts_ns=ts[0])

    emit(
        RunStarted(
            task="kidney-seg",
            tier="standard",
            agent="test-agent",
            model="claude-opus-4.6",
            workspace="/workspace",
        )
    )
    steps = [
        ("mkdir -p plan && write plan", [("plan/plan.md", PLAN)]),
        (
            (
                "import nibabel as nib\nimg = "
                "nib.load('/data/public/case_00000/ct.nii.gz')\nprint(img.shape, img.header.get_zooms())"
            ),
            [],
        ),
    ]
    files = sorted(p for p in (workspace.rglob("*") if workspace else []) if p.is_file())
    outputs = [
        (str(p.relative_to(workspace or Path())), p.read_bytes())
        for p in files
        if drop_case is None or drop_case not in str(p)
    ]
    cases = sorted({path.split("/")[1] for path, _ in outputs})
    if cases:
        steps.append(("run_case(pilot)", [o for o in outputs if f"/{cases[0]}/" in o[0]]))
        steps.append(
            ("m = nib.load('agents_outputs/x/organ.nii.gz').get_fdata(); print(m.shape, np.unique(m))", [])
        )
        steps.append(("for pid in cases: run_case(pid)", [o for o in outputs if f"/{cases[0]}/" not in o[0]]))
    if traceback:  # one crashed execution, recovered from: the rules fire E4
        steps.insert(2, ("x = undefined_name + 1", [("!fail", b"")]))
    for i, (code, written) in enumerate(steps):
        crashed = written == [("!fail", b"")]
        written = [] if crashed else written
        args = '{{"language": "python", "code": {}}}'.format(__import__("json").dumps(code))
        emit(
            ModelCallCompleted(
                call_id=f"c{i}",
                provider="openai",
                api="chat.completions",
                model="claude-opus-4.6",
                message=AssistantMessage(
                    tool_calls=[ToolCallPart(id=f"t{i}", name="execute_code", arguments=args)]
                ),
                usage=Usage(input_total=10_000, output=500),
            )
        )
        emit(
            ToolCallRequested(
                tool_call_id=f"t{i}", name="execute_code", arguments=args, model_call_id=f"c{i}"
            )
        )
        for path, data in written:
            emit(
                FileWritten(
                    path=path,
                    op="created",
                    size=len(data),
                    sha256=digest(data),
                    content=blobs.put(data, sync=False),
                )
            )
        emit(
            ToolCallResult(
                tool_call_id=f"t{i}",
                model_call_id=f"c{i + 1}",
                output=(
                    '{"exit_code": 1, "stdout": "", "stderr": "Traceback (most recent call last):\\n'
                    '  File \\"<exec>\\", line 1\\nNameError: name \'undefined_name\' is not defined"}'
                    if crashed
                    else '{"exit_code": 0, "stdout": "ok", "stderr": ""}'
                ),
            )
        )
    if workspace is not None:
        sealed = [
            SealedFile(path=p, size=len(d), sha256=digest(d), content=blobs.put(d, sync=False))
            for p, d in outputs
        ]
        sealed.append(
            SealedFile(
                path="plan/plan.md", size=len(PLAN), sha256=digest(PLAN), content=blobs.put(PLAN, sync=False)
            )
        )
        emit(SubmissionSealed(root="/workspace", files=sealed))
    emit(RunFinished(status="completed", exit_code=0, duration_s=600.0))
    w.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    spec = load_spec("kidney-seg")
    refs = tmp / "refs"
    synth(spec, refs / "kidney-seg", cases=3, seed=7)
    ws = tmp / "ws"
    perfect_submission(spec, refs / "kidney-seg", ws)
    store = tmp / "store"
    record(store, "perfect", ws)
    record(store, "one-missing", ws, drop_case="case_00002")
    record(store, "nothing", None)
    ingest(store)
    return store, refs


def test_graded_runs(recorded):
    store, refs = recorded
    paper = load("paper-2026-06")
    with open_store(store) as st:
        rows = {r["run_id"]: r for r in score_runs(st, paper, judge="offline", references=refs).rows}
        n_grades = st.con.execute("SELECT count(*) FROM grade_cache").fetchall()[0][0]
        again = {r["run_id"]: r for r in score_runs(st, paper, judge="offline", references=refs).rows}
        assert st.con.execute("SELECT count(*) FROM grade_cache").fetchall()[0][0] == n_grades == 3
        code = {
            r["run_id"]: r
            for r in score_runs(st, load("code-2026-04"), judge="offline", references=refs).rows
        }
    assert rows == again
    p = rows["perfect"]
    assert p["task_score"] == pytest.approx(1.0) and p["s4"] == 1.0 and p["s5"] == 1.0
    assert p["status"] == "completed" and p["codes"] == [] and p["s3"] == 1.0
    assert p["overall"] == pytest.approx(0.5 * p["agentic"] + 0.5)
    assert p["cost_usd"] == pytest.approx(5 * (50_000 * 5 + 2_500 * 25) / 1e6 / 5)
    m = rows["one-missing"]
    assert m["task_score"] == pytest.approx(2 / 3, abs=1e-6) and m["s4"] == pytest.approx(0.5 * 2 / 3 + 0.5)
    assert "E5" in m["codes"] and m["status"] == "completed"
    assert code["one-missing"]["task_score"] == 0.0  # the public code's all-or-nothing gate
    n = rows["nothing"]
    assert n["task_score"] == 0.0 and n["status"] == "failed" and "E5" in n["codes"] and n["s4"] == 0.0


def test_without_references_task_is_unscored_not_zero(recorded):
    store, _ = recorded
    with open_store(store) as st:
        row = score_runs(st, load("paper-2026-06"), judge="offline", run_ids=["perfect"]).rows[0]
    assert row["task_score"] is None and row["overall"] is None and row["status"] == "ungraded"
    assert "no references" in row["reasons"]["TASK"] and row["agentic"] is not None


def test_medal_rating_and_code_suppression(tmp_path):
    """Medal and rating land in every row under both profiles; the code profile drops the fired
    codes of a valid run with a medal of at least okay (failure_classifier.classify_failure's
    success override), keeping them in details marked suppressed."""
    from schemas.score_row import COLUMNS, column_types

    spec = load_spec("kidney-seg")
    refs = tmp_path / "refs"
    synth(spec, refs / "kidney-seg", cases=3, seed=7)
    ws = tmp_path / "ws"
    perfect_submission(spec, refs / "kidney-seg", ws)
    store = tmp_path / "store"
    record(store, "crashed-once", ws, traceback=True)
    record(store, "one-missing", ws, drop_case="case_00002")
    ingest(store)
    with open_store(store) as st:
        paper = {
            r["run_id"]: r
            for r in score_runs(st, load("paper-2026-06"), judge="offline", references=refs).rows
        }
        code = {
            r["run_id"]: r
            for r in score_runs(st, load("code-2026-04"), judge="offline", references=refs).rows
        }
        described = st.con.execute("DESCRIBE scores").fetchall()
        cols = [r[0] for r in described]
        stored = st.con.execute(
            "SELECT run_id, profile_name, medal, rating FROM scores_current ORDER BY run_id, profile_name"
        ).fetchall()
    # The migrated table is exactly ScoreRow: names in order and the types its annotations give.
    assert cols == ["batch_id", "seq", "scored_at", *COLUMNS]
    assert {r[0]: r[1] for r in described[3:]} == column_types()
    p, c = paper["crashed-once"], code["crashed-once"]
    assert p["codes"] == ["E4"] and (p["medal"], p["rating"]) == ("good", "A")
    assert c["codes"] == [] and (c["medal"], c["rating"]) == ("good", "A")
    assert c["details"]["codes"][0]["code"] == "E4" and c["details"]["codes"][0]["suppressed"]
    assert c["reasons"]["codes"].startswith("suppressed")
    # eval_seg build_report: a missing case zeroes TASK and the tier, masks invalid → F; not suppressed.
    m = code["one-missing"]
    assert m["task_score"] == 0.0 and (m["medal"], m["rating"]) == ("fail", "F") and "E5" in m["codes"]
    assert paper["one-missing"]["rating"] == "F"
    assert ("crashed-once", "code-2026-04", "good", "A") in stored
