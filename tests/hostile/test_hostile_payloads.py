"""Events whose payload is not what their kind says: a string where a number belongs, an array where
an object does. Only a hostile spool holds them (the recorder writes its own structs), and ingest
stores them as written: the hash covers what was recorded, and `amb verify` stays clean. Every
command that reads them then either shows them (a field of another type as NULL, labels that are
no text as their JSON) or names the malformed event and exits 1; never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from amb.main import cli
from replay.ingest import ingest
from schemas.codec import GENESIS, current_version
from schemas.frames import MAGIC, encode_frame

BAD_FINISH = '{"status":7,"exit_code":"x","duration_s":"y"}'
"""A run.finished whose fields are all of another type."""

STARTS = {
    "array": "[1]",
    "text": '"x"',
    "null": "null",
    "typed": '{"labels":{"a":1,"b":"ok","c":[true]},"task":5,"tier":[1]}',
}
"""Each run's run.started payload."""

HUGE_FINISH = '{"duration_s":1e400,"exit_code":123456789012345678901234567890,"status":"completed"}'
"""A run.finished whose numbers are out of every range (``huge``'s)."""
HUGE_CALL = '{"latency_ms":1e400,"started_ns":99999999999999999999,"usage":{"input_total":1e400}}'
DEEP = '{"labels":' + "[" * 20_000 + "]" * 20_000 + ',"task":"t"}'
"""A payload nested deeper than any decoder's recursion (``deep``'s run.started)."""
RUNS = [*STARTS, "huge", "deep"]


OTHERS = [
    ("model_call.completed", '{"usage":{"input_total":"many","output":[1]},"ok":"yes","latency_ms":"slow"}'),
    ("process.exited", '{"argv":"not a list","start_ns":"then","end_ns":{"a":1},"pid":"p"}'),
    ("tool_call.requested", '{"arguments":{"a":1},"name":["x"],"tool_call_id":"7"}'),
    ("tool_call.result", '{"is_error":"maybe","tool_call_id":7}'),
]
"""Events between the start and the end of the ``typed`` run."""


def _body(kind: str, payload: str, prev: str, run: str, seq: int) -> bytes:
    """A canonical event body (keys sorted, no spaces) around a payload given as JSON text."""
    tail = f'"prev_hash":"{prev}","run_id":"{run}","seq":{seq},"source":"recorder","ts_ns":{1000 + seq}'
    return f'{{"kind":"{kind}","payload":{payload},{tail},"v":{current_version(kind)}}}'.encode()


def _write_spool(root: Path, run: str, events: list[tuple[str, str]]) -> None:
    prev, data = GENESIS, MAGIC
    for seq, (kind, payload) in enumerate(events):
        body = _body(kind, payload, prev, run, seq)
        digest = hashlib.sha256(body).hexdigest()
        data += encode_frame(body, digest)
        prev = "sha256:" + digest
    path = root / "spool" / run / "recorder.spool"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile-payloads") / "store"
    for run, start in STARTS.items():
        middle = OTHERS if run == "typed" else []
        _write_spool(root, run, [("run.started", start), *middle, ("run.finished", BAD_FINISH)])
    _write_spool(
        root,
        "huge",
        [("run.started", "{}"), ("model_call.completed", HUGE_CALL), ("run.finished", HUGE_FINISH)],
    )
    _write_spool(
        root, "deep", [("run.started", DEEP), ("note", DEEP), ("run.finished", '{"status":"completed"}')]
    )
    report = ingest(root)
    assert report.events_added == 2 * len(STARTS) + len(OTHERS) + 6
    return root


def amb(*args: str) -> tuple[int, str, str]:
    """The command's exit code, output and errors; it must keep the CLI's contract."""
    result = CliRunner().invoke(cli, list(args), env={"AMB_STORE": "", "COLUMNS": "200"})
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, result.stdout, result.stderr


def test_verify_keeps_them_as_recorded(store):
    code, out, _ = amb("verify", "--store", str(store))
    assert code == 0 and out.startswith("OK "), out


def test_the_runs_list_and_show_read_a_field_of_another_type_as_nothing(store):
    code, out, _ = amb("runs", "--json", "--store", str(store))
    listed = {r["run_id"]: r for r in json.loads(out)}
    assert code == 0 and set(listed) == set(RUNS)
    assert listed["typed"]["duration_s"] is None and listed["typed"]["status"] == "7"
    shown = {}
    for run in RUNS:
        code, out, _ = amb("show", run, "--json", "--store", str(store))
        shown[run] = json.loads(out)
        assert code == 0 and shown[run]["run_id"] == run
    typed = shown["typed"]
    assert typed["exit_code"] is None and typed["task"] == "5" and typed["tier"] == "[1]"
    assert typed["labels"] == {"a": "1", "b": "ok", "c": "[true]"} and shown["array"]["labels"] == {}
    # Numbers out of every range: nothing, while the rest of the payload still reads.
    huge = shown["huge"]
    assert (huge["status"], huge["duration_s"], huge["exit_code"]) == ("completed", None, None)


@pytest.mark.parametrize("view", ["runs", "model_calls", "processes", "tool_calls"])
def test_every_view_reads_them(store, view):
    code, out, _ = amb("sql", f"SELECT * FROM {view}", "--format", "json", "--store", str(store))
    assert code == 0, out
    every = json.loads(out, parse_constant=_no_constant)  # strict JSON: no Infinity or NaN
    if view == "model_calls":  # 1e400 is a DOUBLE's infinity, written as its text
        assert [r["latency_ms"] for r in every if r["run_id"] == "huge"] == ["inf"]
    rows = [r for r in every if r["run_id"] in ("typed", None)]
    assert rows, f"no rows of the typed run in {view}"
    if view == "model_calls":
        assert rows[0]["input_tokens"] is None and rows[0]["latency_ms"] is None
    if view == "processes":
        assert rows[0]["cmd"] is None and rows[0]["duration_ms"] is None
    if view == "tool_calls":
        assert rows[0]["is_error"] is None and rows[0]["answered_ns"] is not None


def _no_constant(name: str):
    raise AssertionError(f"{name} is not JSON")


def test_a_parquet_export_holds_every_run(store, tmp_path):
    code, out, _ = amb("export", "parquet", "--store", str(store), str(tmp_path / "pq"))
    assert code == 0, out
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "pq" / "runs.parquet").num_rows == len(RUNS)


@pytest.mark.parametrize(
    "command",
    [
        ["score", "--all", "--judge", "offline"],
        ["audit", "typed"],
        ["audit", "deep"],
        ["export", "atif", "deep"],
        ["files", "deep"],  # (from the run's spool, which its recorder keeps)
    ],
)
def test_typed_readers_name_the_malformed_event(store, command):
    code, _, err = amb(*command, "--store", str(store))
    assert code == 1 and "malformed" in err and ("seq 0" in err or "frame 0" in err), err


def test_the_viewer_lists_them_and_shows_each_run(store):
    from replay.web.server import Running

    with Running(store) as viewer:
        with urllib.request.urlopen(viewer.url + "/api/runs", timeout=60) as r:
            page = json.loads(r.read())
        assert {row["run_id"] for row in page["runs"]} == set(RUNS)
        asked = [
            f"/api/runs/{run}{endpoint}"
            for run in RUNS
            for endpoint in ("", "/events", "/scores", "/verify", "/timeline", "/workspace")
        ]
        asked += [f"/api/runs/typed/events/recorder/{seq}" for seq in range(len(OTHERS) + 2)]
        asked += ["/api/runs/huge/events/recorder/1", "/api/runs/huge/calls/recorder/1"]
        asked += [f"/api/runs/deep/events/recorder/{seq}" for seq in range(3)]
        asked += ["/api/diff?a=deep&b=huge", "/api/runs?q=t"]
        asked += ["/api/runs/typed/calls/recorder/1", "/api/diff?a=typed&b=array", "/api/grid?task=5"]
        for path in asked:
            try:
                with urllib.request.urlopen(viewer.url + path, timeout=60) as r:
                    assert r.status == 200
                    json.loads(r.read())
            except urllib.error.HTTPError as e:
                # A refusal names what it refuses, as JSON; a typed reader names the malformed event.
                why = json.loads(e.read())["error"]
                assert e.code < 500 or ("malformed" in why and "seq" in why), (path, e.code, why)
