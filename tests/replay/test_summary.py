"""replay.summary: a run's summary is one definition, whether the store's query gives it (amb runs,
amb show, the viewer) or it is folded from the run's events as they are read (amb watch)."""

from __future__ import annotations

import pytest

from recorder.spool import SpoolWriter, spool_path
from replay.ingest import ingest
from replay.read import iter_events
from replay.store import Store, open_sql
from replay.summary import RunSummary, summaries, summary
from replay.web.runs import RunRow, build_run_index
from schemas.errors import NotFound
from schemas.events import (
    FileWritten,
    ModelCallCompleted,
    ProcessExited,
    RunFinished,
    RunStarted,
    ToolCallRequested,
    Usage,
)


def _unfinished(root) -> None:
    """A run still recording when it was ingested: no run.finished, a failed call, two models."""
    rec = SpoolWriter(spool_path(root, "live", "recorder"), "live", "recorder", sync=False)
    rec.append(RunStarted(task="kidney-seg", tier="lite", agent="a", model="m1", labels={"k": "v"}), ts_ns=5)
    proxy = SpoolWriter(spool_path(root, "live", "proxy"), "live", "proxy", sync=False)
    proxy.append(
        ModelCallCompleted(
            call_id="c1",
            provider="openai",
            api="chat.completions",
            model="m1",
            usage=Usage(input_total=100, cache_read=40, output=7, reasoning=3),
        ),
        ts_ns=3,  # before run.started: the span is every event's
    )
    proxy.append(
        ModelCallCompleted(
            call_id="c2", provider="openai", api="chat.completions", model="m2", ok=False, error="boom"
        ),
        ts_ns=9,
    )
    proxy.append(ToolCallRequested(tool_call_id="t", name="x", arguments="{}", model_call_id="c1"), ts_ns=10)
    shim = SpoolWriter(spool_path(root, "live", "shim"), "live", "shim", sync=False)
    shim.append(ProcessExited(pid=2, ppid=1, argv=["ls"], exit_code=1), ts_ns=11)
    shim.append(FileWritten(path="a", op="created", size=1, sha256="sha256:" + "0" * 64), ts_ns=12)
    for w in (rec, proxy, shim):
        w.close()


def _failed_and_unstarted(root) -> None:
    """A run that failed with labels of its own, and one whose recorder wrote nothing (no run.started:
    it is listed after every run that started)."""
    rec = SpoolWriter(spool_path(root, "failed", "recorder"), "failed", "recorder", sync=False)
    rec.append(RunStarted(task="t2", agent="b", backend="docker", labels={"repeat": "2", "x": "y"}), ts_ns=1)
    rec.append(RunFinished(status="failed", exit_code=3, duration_s=4), ts_ns=20)
    proxy = SpoolWriter(spool_path(root, "headless", "proxy"), "headless", "proxy", sync=False)
    proxy.append(
        ModelCallCompleted(call_id="c", provider="openai", api="chat.completions", model="m", ok=False),
        ts_ns=2,
    )
    for w in (rec, proxy):
        w.close()


@pytest.fixture
def stored(store):
    """The three synthetic runs of ``store`` and one still recording, ingested."""
    _unfinished(store)
    ingest(store)
    with Store.open(store, read_only=True) as st:
        yield st.con


def test_the_query_and_the_fold_give_the_same_summary(stored):
    listed = summaries(stored)
    assert sorted(s.run_id for s in listed) == ["live", "run-0", "run-1", "run-2"]
    assert listed == sorted(listed, key=lambda s: (s.started_ns, s.run_id))  # by start, then id
    for s in listed:
        folded = RunSummary(run_id=s.run_id)
        for ev in iter_events(stored, s.run_id):
            folded.add(ev)
        assert folded == s == summary(stored, s.run_id)


def test_an_unfinished_run_with_a_failed_call(stored):
    s = summary(stored, "live")
    assert (s.status, s.exit_code, s.duration_s) == ("unfinished", None, None)
    assert (s.model_calls, s.failed_calls, s.models) == (2, 1, ["m1", "m2"])
    assert (s.tokens.input, s.tokens.cache_read, s.tokens.output, s.tokens.reasoning) == (100, 40, 7, 3)
    assert (s.tool_calls, s.processes, s.file_writes, s.events) == (1, 1, 1, 6)
    assert (s.started_ns, s.first_ns, s.last_ns, s.labels) == (5, 3, 12, {"k": "v"})
    assert s.cost_usd is None  # nothing priced it: unknown, not 0


def test_a_run_the_store_does_not_hold_is_not_found(stored):
    with pytest.raises(NotFound, match="no run 'nope'"):
        summary(stored, "nope")


def _same_runs_as_the_summaries(con) -> list[RunRow]:
    """The index's rows: the summaries' runs in their order, with their time spans."""
    listed = summaries(con)
    index = build_run_index(con, (0, 0, 0))
    assert [r.run_id for r in index.rows] == [s.run_id for s in listed]
    assert index.spans == {s.run_id: (s.first_ns, s.last_ns) for s in listed}
    return index.rows


def test_the_viewers_run_index_lists_the_summaries(stored, store):
    stored.close()
    _failed_and_unstarted(store)
    ingest(store)
    with Store.open(store, read_only=True) as st:
        rows = _same_runs_as_the_summaries(st.con)
    assert [r.run_id for r in rows][-1] == "headless" and rows[-1].started_ns is None
    failed = next(r for r in rows if r.run_id == "failed")
    assert (failed.status, failed.exit_code, failed.duration_s, failed.labels["repeat"]) == (
        "failed",
        3,
        4.0,
        "2",
    )
    live = next(r for r in rows if r.run_id == "live")
    assert (live.status, live.n_model_calls, live.tokens) == ("unfinished", 2, 107)
    assert (live.tokens_in, live.tokens_out, live.n_events, live.n_tool_calls) == (100, 7, 6, 1)
    assert (live.started_ns, live.labels, live.model) == ("5", {"k": "v"}, "m1")


def test_the_viewers_run_index_of_recorded_hostile_and_scored_runs(viewer_store):
    con = open_sql(viewer_store.root)
    try:
        rows = _same_runs_as_the_summaries(con)
    finally:
        con.close()
    assert any(r.scores for r in rows)
