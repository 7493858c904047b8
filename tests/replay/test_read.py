"""Typed read-back of several runs at once: with the runs' row spans, a query reads only the row
groups between their first and last rows, and returns what the query over every run id returns,
however the runs' rows lie in the table."""

from __future__ import annotations

import json

from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay.ingest import ingest
from replay.read import row_spans, runs_rows
from replay.store import Store
from schemas.events import Note


def test_runs_read_by_their_row_spans_are_the_runs_read_by_their_ids(tmp_path):
    """Runs ingested whole, and two runs whose rows are interleaved (each ingest adds a note to
    each, so a run's span holds the other's rows): every selection of them reads the same rows
    with and without the spans; a run not in the spans (no events when they were taken) is absent,
    as a run with no events is."""
    root = tmp_path / "store"
    for i in range(3):
        generate_run(root, f"whole-{i}", seed=i, calls=4)
    writers = {run: SpoolWriter(spool_path(root, run, "proxy"), run, "proxy") for run in ("a", "b")}
    for step in range(3):
        for run, w in writers.items():
            w.append(Note(text=f"{run} {step}"))
        ingest(root, spool_mode="keep")
    for w in writers.values():
        w.close()
    with Store.open(root, read_only=True) as st:
        spans = row_spans(st.con)
        assert spans["a"][0] < spans["b"][0] < spans["a"][1] < spans["b"][1]  # (interleaved)
        selections = [
            ["a"],
            ["b"],
            ["a", "b"],
            ["whole-1"],
            ["whole-0", "whole-2"],
            ["a", "whole-1", "nobody"],
        ]
        for runs in selections:
            assert runs_rows(st.con, runs, spans=spans) == runs_rows(st.con, runs), runs
        assert [json.loads(r[6])["text"] for r in runs_rows(st.con, ["a"], spans=spans)["a"]] == [
            f"a {step}" for step in range(3)
        ]
        assert runs_rows(st.con, ["nobody"], spans=spans) == {}
        assert runs_rows(st.con, ["a"], spans={**spans, "a": (spans["b"][1] + 1, spans["b"][1] + 5)}) == {}
