"""Foreign numbers, times and text are checked before a byte of the input is written.

A value that cannot be a fact refuses the whole input: exit 2, one line on stderr naming the file
as given, the step or record, the field and the value; the store stays byte for byte as it was and
the next `amb ingest` works (unchecked, a year-9999 timestamp leaves a spool no ingest can load; a
year-1 one puts a model call before run.started; NaN tokens, a lone surrogate and 1e308 tokens end
in a traceback, the last one only later, in `amb score`). In-range times earlier than the first
step start the run earlier: nothing precedes run.started.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from recorder.synthetic import generate_run
from replay.store import Store
from tests.recorder.importers import amb_fixtures as fx
from tests.recorder.importers.store_state import amb, files


def trajectory(step2: dict[str, Any] | None = None, model: Any = "m") -> dict[str, Any]:
    agent_step = {
        "step_id": 2,
        "source": "agent",
        "message": "ok",
        "timestamp": "2025-01-01T00:00:00.500Z",
        "metrics": {"prompt_tokens": 5, "completion_tokens": 3},
        **(step2 or {}),
    }
    return {
        "schema_version": "ATIF-v1.6",
        "session_id": "s",
        "agent": {"name": "a", "version": "1", "model_name": model},
        "steps": [
            {"step_id": 1, "source": "user", "message": "hi", "timestamp": "2025-01-01T00:00:00Z"},
            agent_step,
            {"step_id": 3, "source": "agent", "message": "done", "timestamp": "2025-01-01T00:00:00.780Z"},
        ],
    }


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store holding one recorded run, ingested."""
    root = tmp_path / "store"
    generate_run(root, "rec-1", seed=1, calls=2)
    assert amb("ingest", "--store", str(root)).exit_code == 0
    return root


def _refused(store: Path, args: list[str], *expect: str) -> None:
    before = files(store)
    r = amb("import", *args[:1], "--store", str(store), *args[1:])
    assert r.exit_code == 2 and r.exception is None or isinstance(r.exception, SystemExit), r.output
    assert r.exit_code == 2, r.output
    errors = [x for x in r.stderr.splitlines() if x.startswith("amb: error:")]
    assert len(errors) == 1 and "Traceback" not in r.output, r.stderr
    for part in expect:
        assert part in errors[0], (part, errors[0])
    assert files(store) == before
    assert amb("ingest", "--store", str(store)).exit_code == 0
    assert amb("verify", "--store", str(store)).output.startswith("OK")


ATIF: dict[str, tuple[dict[str, Any], str]] = {
    "year-9999": ({"timestamp": "9999-12-31T23:59:59Z"}, "step 2: timestamp 9999-12-31T23:59:59"),
    "year-1": ({"timestamp": "0001-01-01T00:00:00Z"}, "step 2: timestamp 0001-01-01T00:00:00"),
    "nan-tokens": ({"metrics": {"prompt_tokens": float("nan")}}, "step 2: metrics.prompt_tokens is nan"),
    "inf-tokens": ({"metrics": {"completion_tokens": float("inf")}}, "metrics.completion_tokens is inf"),
    "1e308-tokens": ({"metrics": {"prompt_tokens": 1e308}}, "metrics.prompt_tokens is 1e+308, outside"),
    "negative-tokens": ({"metrics": {"prompt_tokens": -5}}, "metrics.prompt_tokens is -5, outside"),
    "fraction-tokens": ({"metrics": {"prompt_tokens": 2.5}}, "metrics.prompt_tokens is 2.5, not a whole"),
    "string-tokens": (
        {"metrics": {"prompt_tokens": "12"}},
        "metrics.prompt_tokens is '12', not a whole number",
    ),
    "huge-ts-ns": ({"extra": {"amb": {"ts_ns": 10**20}}}, "step 2: extra.amb.ts_ns"),
    "nan-latency": (
        {"extra": {"amb": {"call": {"latency_ms": float("nan")}}}},
        "extra.amb.call.latency_ms is nan, not a duration",
    ),
    "negative-retries": ({"extra": {"amb": {"call": {"retries": -1}}}}, "extra.amb.call.retries is -1"),
    # extra.amb is what an AMB export wrote: a value of another type is refused, not read as a default.
    "number-provider": (
        {"extra": {"amb": {"call": {"provider": 7}}}},
        "steps[1].extra.amb.call.provider: Expected `str`, got `int`",
    ),
    "text-amb": ({"extra": {"amb": "yes"}}, "steps[1].extra.amb: Expected `object | null`, got `str`"),
    "number-requested": (
        {"extra": {"amb": {"requested": {"t1": 5}}}},
        "steps[1].extra.amb.requested[...]: Expected `object`, got `int`",
    ),
    "negative-inline-chars": (
        {
            "tool_calls": [{"tool_call_id": "t1", "function_name": "f", "arguments": {}}],
            "observation": {"results": [{"source_call_id": "t1", "content": "abcdef"}]},
            "extra": {"amb": {"results": [{"inline_chars": -3}]}},
        },
        "step 2: extra.amb.results[0].inline_chars is -3, outside 0..",
    ),
    "surrogate-message": ({"message": "half \ud83d"}, "steps[1].message: text that is not Unicode"),
    "surrogate-key": ({"metrics": {"\udc80": 1}}, "text that is not Unicode"),
}


@pytest.mark.parametrize("kind", list(ATIF))
def test_atif_values_that_are_no_facts_refuse_the_file(store, tmp_path, kind):
    step2, expect = ATIF[kind]
    path = tmp_path / "given" / f"{kind}.json"
    path.parent.mkdir()
    # Python writes NaN and Infinity, as a Python harness's json.dump would; lone surrogates as \\u escapes.
    path.write_text(json.dumps(trajectory(step2)))
    _refused(store, ["atif", str(path)], f"{path}: ", expect)


def test_a_foreign_harness_s_own_extra_keys_are_ignored(tmp_path):
    """Keys beside ``amb`` (and ``metrics.extra`` keys AMB does not write) are the harness's own."""
    foreign = {
        "extra": {"harness": {"retries": "three"}, "ts_ns": "now"},
        "metrics": {"prompt_tokens": 5, "extra": {"cost_usd": "0.1", "logprobs": [1]}},
    }
    doc = {**trajectory(foreign), "extra": {"harness_run": {"id": 7}}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    r = amb("import", "atif", "--store", str(tmp_path / "s"), "--json", str(path))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)[0]["run_id"].startswith("atif-")


def test_a_lone_surrogate_in_the_model_name_refuses_the_file(store, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trajectory(model="gpt\ud800")))
    _refused(store, ["atif", str(path)], f"{path}: agent.model_name: text that is not Unicode")


def test_emoji_written_as_surrogate_pairs_import(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trajectory({"message": "ok 😀"})))  # ensure_ascii: \ud83d\ude00
    r = amb("import", "atif", "--store", str(tmp_path / "s"), "--json", str(path))
    assert r.exit_code == 0, r.output


def test_a_step_dated_before_the_first_starts_the_run_earlier(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trajectory({"timestamp": "2024-12-31T23:59:59Z"})))
    store = tmp_path / "s"
    r = amb("import", "atif", "--store", str(store), "--json", str(path))
    assert r.exit_code == 0, r.output
    run = json.loads(r.stdout)[0]["run_id"]
    with Store.open(store, read_only=True) as st:
        first = st.con.execute(
            "SELECT kind FROM events WHERE run_id = ? ORDER BY ts_ns, seq LIMIT 1", [run]
        ).fetchall()
        [(dur,)] = st.con.execute("SELECT duration_s FROM runs WHERE run_id = ?", [run]).fetchall()
    assert first == [("run.started",)] and dur == pytest.approx(1.78)


def test_a_sidecar_line_dated_outside_the_clock_refuses_the_folder(store, tmp_path):
    out = tmp_path / "atif"
    assert amb("export", "atif", "--store", str(store), "rec-1", "--out", str(out)).exit_code == 0
    folder = tmp_path / "given"
    shutil.copytree(out / "rec-1", folder)
    lines = (folder / "events.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["ts_ns"] = 1 << 64
    (folder / "events.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    _refused(store, ["atif", "--run-id", "other", str(folder)], f"{folder}/events.jsonl: line 1: ts_ns")


def _seg(tmp_path: Path, edit) -> Path:
    src = fx.seg_local(tmp_path / "src", "kidney-seg", "kidney", tmp_path)
    run = tmp_path / "given" / "260101-abcdef"
    shutil.copytree(src, run, symlinks=True)
    edit(run)
    return run


def _trace(field: str, value: Any):
    def edit(run: Path) -> None:
        path = run / "process" / "trace.jsonl"
        recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        first = next(r for r in recs if r.get("type") == "api_call")
        first[field] = value
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))

    return edit


AUTOMEDBENCH = {
    "nan-tokens": (_trace("input_tokens", float("nan")), "trace.jsonl: record 1: input_tokens is nan"),
    "1e308-tokens": (_trace("output_tokens", 1e308), "output_tokens is 1e+308, outside"),
    "negative-tokens": (_trace("input_tokens", -1), "input_tokens is -1, outside"),
    "inf-ts": (_trace("ts", float("inf")), "ts is inf, not a duration"),
    "nan-turn": (_trace("turn", float("nan")), "turn is nan"),
    "surrogate": (_trace("content_preview", "x\udfff"), "trace.jsonl: line 1: content_preview: text that"),
}


@pytest.mark.parametrize("kind", list(AUTOMEDBENCH))
def test_automedbench_values_that_are_no_facts_refuse_the_folder(store, tmp_path, kind):
    edit, expect = AUTOMEDBENCH[kind]
    run = _seg(tmp_path, edit)
    _refused(store, ["automedbench", str(run)], expect)


def _json_field(name: str, key: str, value: Any):
    def edit(run: Path) -> None:
        path = run / name
        doc = json.loads(path.read_text())
        doc[key] = value
        path.write_text(json.dumps(doc))

    return edit


WRONG_TYPES = {
    "conversation-model": (
        "process/conversation.json",
        "model",
        7,
        "conversation.json: model: Expected `str | null`",
    ),
    "conversation-messages": ("process/conversation.json", "messages", "hi", "messages: Expected `array"),
    "report-header": (
        "detail_report.json",
        "header",
        [1],
        "detail_report.json: header: Expected `object | null`",
    ),
}


@pytest.mark.parametrize("kind", list(WRONG_TYPES))
def test_automedbench_files_of_the_wrong_shape_refuse_the_folder(store, tmp_path, kind):
    """A run folder's JSON file whose field has the wrong type is refused in one line naming the
    file and the field, not read as if the field were absent."""
    name, key, value, expect = WRONG_TYPES[kind]
    run = _seg(tmp_path, _json_field(name, key, value))
    _refused(store, ["automedbench", str(run)], expect)


def test_an_atif_run_without_sidecar_lasts_its_steps_and_its_ending_is_unknown(tmp_path):
    """ATIF keeps no ending: the run lasted as long as its steps span (0.78 s here, not 0.0 s), its
    status is ``unknown`` (not ``completed``), and every reader agrees: the runs view, the
    OpenTelemetry export (span status unset, not an error), the scorer (no ending read into it)."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trajectory()))
    store = tmp_path / "s"
    r = amb("import", "atif", "--store", str(store), "--json", str(path))
    assert r.exit_code == 0, r.output
    run = json.loads(r.stdout)[0]["run_id"]
    show = json.loads(amb("show", "--store", str(store), run, "--json").output)
    assert show["status"] == "unknown" and show["duration_s"] == pytest.approx(0.78)
    otel = amb("export", "otel", "--store", str(store), run)
    assert otel.exit_code == 0, otel.output
    spans = [
        s for rs in json.loads(otel.stdout)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]
    root = next(s for s in spans if s["name"].startswith("invoke_agent"))
    assert root["status"] == {"code": 0}
    scored = amb("score", "--store", str(store), run, "--json")
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.stdout)["rows"][0]["status"] in ("no_data", "ungraded")


def test_an_output_file_whose_name_is_not_utf8_is_named_not_a_traceback(store, tmp_path):
    """A file name's bytes that are not UTF-8 either are recorded (where the event encoding keeps
    such bytes) or refuse the folder naming the file and the bytes; never a traceback."""
    run = _seg(tmp_path, lambda run: None)
    with open(os.fsencode(run / "outputs" / "agents_outputs") + b"/bad\xffname", "wb") as f:
        f.write(b"x")
    before = files(store)
    r = amb("import", "automedbench", "--store", str(store), str(run))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    if r.exit_code == 2:
        assert "file.written event: path 'agents_outputs/bad\\xffname'" in r.stderr, r.stderr
        assert "bytes that are not UTF-8" in r.stderr and files(store) == before
    else:
        assert r.exit_code == 0, r.output
    assert amb("verify", "--store", str(store)).output.startswith("OK")
