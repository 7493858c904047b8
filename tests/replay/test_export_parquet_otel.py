"""``amb export parquet`` reads back identical; ``amb export otel`` parses with the official OTLP
protobuf classes and carries the pinned GenAI attribute names, span by span."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from amb.main import cli
from recorder.synthetic import generate_run
from replay.export.otel import SCHEMA_URL, SEMCONV_VERSION, span_id, trace_id
from replay.export.parquet import EVENTS_PER_FILE, read_glob, sources
from replay.ingest import ingest
from tests.replay.export_helpers import export_of_a_big_run


def amb(*args: str):
    return CliRunner().invoke(cli, list(args), env={"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": ""})


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("px") / "store"
    for i in range(3):
        generate_run(root, f"r{i:04d}", seed=i, calls=5)  # ids that look like numbers stay strings
    ingest(root)
    r = amb("score", "--store", str(root), "--all", "--json")
    assert r.exit_code == 0, r.output
    return root


@pytest.mark.parametrize("per_file", [None, "1", "40"])
def test_parquet_reads_back_identical(store, tmp_path, per_file):
    out = tmp_path / "pq"
    args = ["export", "parquet", "--store", str(store), str(out), "--json"]
    r = amb(*args, *(["--events-per-file", per_file] if per_file else []))
    assert r.exit_code == 0, r.output
    written = {w["name"]: w for w in json.loads(r.output)}
    assert {"events", "runs", "model_calls", "tool_calls", "processes", "file_writes", "scores"} <= set(
        written
    )
    assert (out / "events" / "run_group=0" / "data_0.parquet").is_file() and (
        out / "model_calls.parquet"
    ).is_file()
    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    try:
        for name, _ in sources(con):
            cols = [r[0] for r in con.execute(f'DESCRIBE SELECT * FROM "{name}"').fetchall()]
            listed = ", ".join(f'"{c}"' for c in cols)
            src = f'SELECT {listed} FROM "{name}"'
            back = f"SELECT {listed} FROM {read_glob(out, name, written[name]['partitioned'])}"
            n = con.execute(f"SELECT count(*) FROM ({src})").fetchall()[0][0]
            assert (
                n == written[name]["rows"] == con.execute(f"SELECT count(*) FROM ({back})").fetchall()[0][0]
            ), name
            # Same rows with the same values, both ways (multiset difference is empty).
            for a, b in ((src, back), (back, src)):
                diff = con.execute(f"SELECT count(*) FROM ({a} EXCEPT ALL {b})").fetchall()[0][0]
                assert diff == 0, (name, a, b)
        assert written["events"]["rows"] == con.execute("SELECT count(*) FROM events").fetchall()[0][0] > 0
        per_run = dict(con.execute("SELECT run_id, count(*) FROM events GROUP BY run_id").fetchall())
    finally:
        con.close()
    _check_groups(out, per_run, int(per_file or EVENTS_PER_FILE))


def _check_groups(out: Path, per_run: dict[str, int], per_file: int) -> None:
    """Each file of events holds whole runs, a contiguous range of run ids that its footer's
    statistics state (so a reader prunes by run), and ``event_groups`` says where each run is."""
    con = duckdb.connect()
    index = con.execute(
        f"SELECT run_id, run_group, events, path FROM {read_glob(out, 'event_groups', False)} ORDER BY run_id"
    ).fetchall()
    assert [(r, n) for r, _, n, _ in index] == sorted(per_run.items())
    files: dict[str, list[str]] = {}
    for run_id, group, n, path in index:
        assert path == f"events/run_group={group}/data_0.parquet"
        files.setdefault(path, []).append(run_id)
        got = con.execute(f"SELECT count(*) FROM '{out / path}' WHERE run_id = ?", [run_id]).fetchall()[0][0]
        assert got == n, (run_id, path)
    # Groups close once they hold per_file events: every group but the last reaches it, and no
    # group would still reach it without its last run.
    sizes = [[per_run[r] for r in runs] for runs in files.values()]
    assert all(sum(s) >= per_file > sum(s) - s[-1] for s in sizes[:-1]) and sum(sizes[-1]) > 0
    assert len(list((out / "events").glob("*/*.parquet"))) == len(files)
    ranges = []
    for path, runs in files.items():
        lo, hi = con.execute(
            "SELECT stats_min_value, stats_max_value FROM parquet_metadata(?) "
            "WHERE path_in_schema = 'run_id'",
            [str(out / path)],
        ).fetchall()[0]
        assert (lo, hi) == (runs[0], runs[-1]), path
        assert (
            sorted(r[0] for r in con.execute(f"SELECT DISTINCT run_id FROM '{out / path}'").fetchall())
            == runs
        )
        ranges.append((lo, hi))
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges  # disjoint, in order
    con.close()


def test_parquet_subset_and_refusals(store, tmp_path):
    out = tmp_path / "pq"
    assert amb("export", "parquet", "--store", str(store), str(out)).exit_code == 0
    # Refuses to overwrite; a subset of runs gives the same layout with fewer groups.
    r = amb("export", "parquet", "--store", str(store), str(out))
    assert r.exit_code != 0 and "is not empty" in r.output
    r = amb("export", "parquet", "--store", str(store), str(tmp_path / "z"), "--events-per-file", "0")
    assert r.exit_code != 0 and "--events-per-file" in r.output
    sub = tmp_path / "sub"
    r = amb("export", "parquet", "--store", str(store), str(sub), "--runs", "r0002", "--runs", "r0000")
    assert r.exit_code == 0, r.output
    assert [p.name for p in (sub / "events").iterdir()] == ["run_group=0"]
    con = duckdb.connect()
    for name in ("events", "model_calls"):
        got = con.execute(
            f"SELECT DISTINCT run_id FROM {read_glob(sub, name, name == 'events')} ORDER BY 1"
        ).fetchall()
        assert got == [("r0000",), ("r0002",)], name
    index = con.execute(f"SELECT run_id, run_group FROM {read_glob(sub, 'event_groups', False)}").fetchall()
    assert sorted(index) == [("r0000", 0), ("r0002", 0)]


def test_parquet_empty_store_keeps_the_layout(tmp_path):
    from replay.store import Store

    root = tmp_path / "empty"
    Store.open(root).close()
    out = tmp_path / "pq"
    r = amb("export", "parquet", "--store", str(root), str(out), "--json")
    assert r.exit_code == 0, r.output
    written = {w["name"]: w["rows"] for w in json.loads(r.output)}
    assert written["events"] == written["event_groups"] == 0
    con = duckdb.connect()
    cols = con.execute(f"DESCRIBE SELECT * FROM {read_glob(out, 'events', True)}").fetchall()
    assert {"run_id", "seq", "hash", "payload", "run_group"} <= {c[0] for c in cols}
    assert con.execute(f"SELECT count(*) FROM {read_glob(out, 'events', True)}").fetchall() == [(0,)]


EXPECTED_ATTRS = {
    # span kind prefix: attribute names that must be present (pinned to semconv SEMCONV_VERSION)
    "invoke_agent": {"gen_ai.operation.name", "gen_ai.agent.name", "gen_ai.conversation.id", "amb.status"},
    "chat": {
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.conversation.id",
        "gen_ai.request.model",
        "gen_ai.response.finish_reasons",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_creation.input_tokens",
        "gen_ai.usage.reasoning.output_tokens",
        "server.address",
        "server.port",
        "amb.call_id",
    },
    "execute_tool": {"gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.type"},
    "process": {"process.pid", "process.command_args", "process.exit.code"},
    "GET": {"http.request.method", "server.address", "url.path", "http.response.status_code"},
}


def _to_proto_json(obj):
    """OTLP JSON → protobuf JSON: the one difference is hex (not base64) trace and span ids."""
    if isinstance(obj, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode()
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
            else _to_proto_json(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_to_proto_json(x) for x in obj]
    return obj


def test_otel_lines_parse_and_pin_attribute_names(store, tmp_path):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    out = tmp_path / "t.jsonl"
    r = amb("export", "otel", "--store", str(store), "r0000", "r0001", "--out", str(out))
    assert r.exit_code == 0, r.output
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    # Deterministic: a second export is byte-identical.
    again = tmp_path / "t2.jsonl"
    assert amb("export", "otel", "--store", str(store), "r0000", "r0001", "--out", str(again)).exit_code == 0
    assert again.read_bytes() == out.read_bytes()
    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    for run, text in zip(("r0000", "r0001"), lines, strict=True):
        msg = json_format.Parse(json.dumps(_to_proto_json(json.loads(text))), ExportTraceServiceRequest())
        rs = msg.resource_spans[0]
        res = {a.key: a.value for a in rs.resource.attributes}
        assert (
            res["amb.run_id"].string_value == run and res["amb.semconv.genai"].string_value == SEMCONV_VERSION
        )
        assert rs.schema_url == SCHEMA_URL
        spans = list(rs.scope_spans[0].spans)
        assert all(s.trace_id.hex() == trace_id(run) for s in spans)
        root = spans[0]
        assert root.name.startswith("invoke_agent ") and not root.parent_span_id
        first = con.execute(
            "SELECT source, seq FROM events WHERE run_id = ? AND kind = 'run.started'", [run]
        ).fetchall()[0]
        assert root.span_id.hex() == span_id(run, *first)
        assert all(s.parent_span_id == root.span_id for s in spans[1:])
        n_calls, n_tools, n_procs, n_net = con.execute(
            """SELECT (SELECT count(*) FROM model_calls WHERE run_id = $1),
                      (SELECT count(*) FROM tool_calls WHERE run_id = $1 AND answered_ns IS NOT NULL),
                      (SELECT count(*) FROM processes WHERE run_id = $1),
                      (SELECT count(*) FROM network_requests WHERE run_id = $1)""",
            [run],
        ).fetchall()[0]
        by_kind: dict[str, list] = {}
        for s in spans:
            head = s.name.split(" ")[0]
            key = "process" if head in ("python3", "bash") else head
            by_kind.setdefault(key, []).append(s)
        assert len(by_kind["chat"]) == n_calls and len(by_kind.get("execute_tool", [])) == n_tools
        assert len(by_kind["process"]) == n_procs and len(by_kind.get("GET", [])) == n_net
        for key, spans_of in by_kind.items():
            for s in spans_of:
                names = {a.key for a in s.attributes}
                assert EXPECTED_ATTRS[key] <= names, (key, EXPECTED_ATTRS[key] - names)
                gen_ai = {n for n in names if n.startswith("gen_ai.")}
                assert gen_ai <= KNOWN_GEN_AI, gen_ai - KNOWN_GEN_AI
                assert s.end_time_unix_nano >= s.start_time_unix_nano
        assert all(s.kind == Span.SPAN_KIND_CLIENT for s in by_kind["chat"])
        assert all(s.kind == Span.SPAN_KIND_INTERNAL for s in by_kind["execute_tool"])
        chat = by_kind["chat"][0]
        usage = {a.key: a.value.int_value for a in chat.attributes if a.key.startswith("gen_ai.usage.")}
        row = con.execute(
            "SELECT input_tokens, cache_read_tokens FROM model_calls WHERE run_id = ? ORDER BY seq LIMIT 1",
            [run],
        ).fetchall()[0]
        assert (usage["gen_ai.usage.input_tokens"], usage["gen_ai.usage.cache_read.input_tokens"]) == row
        assert {e.name for e in root.events} >= {"file.written", "submission.sealed"}
    con.close()


def _known_gen_ai() -> set[str]:
    """Every gen_ai.* attribute name the pinned conventions package defines."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as g

    return {v for k, v in vars(g).items() if k.startswith("GEN_AI_") and isinstance(v, str)}


KNOWN_GEN_AI: set[str] = set()


@pytest.fixture(autouse=True, scope="module")
def _load_known():
    KNOWN_GEN_AI.update(_known_gen_ai())


def test_otel_export_of_a_big_run_holds_about_its_output_not_its_events(tmp_path):
    """A run of tens of thousands of events: the export keeps each span encoded as it goes, so the
    memory it takes is about the size of the line it writes (its events as objects, then their
    spans as dicts, took eight times that: 3 GB for a run of 400,000 events)."""
    out = tmp_path / "many.jsonl"
    r, peak = export_of_a_big_run(tmp_path, "otel", "many", "--out", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    assert text.count("\n") == 1
    spans = json.loads(text)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert len(spans) > 10_000 and all(s["parentSpanId"] == spans[0]["spanId"] for s in spans[1:])
    assert peak < 3 * len(text), (peak, len(text))


def test_otel_messages_of_a_gemini_run(tmp_path, genai_run):
    """``--messages``: each chat span carries its call's conversation and answer in the GenAI
    conventions' shape, a Gemini call's function call and function response included."""
    out = tmp_path / "t.jsonl"
    r = amb(
        "export", "otel", "--store", str(genai_run.store), genai_run.run_id, "--messages", "--out", str(out)
    )
    assert r.exit_code == 0, r.output
    spans = json.loads(out.read_text())["resourceSpans"][0]["scopeSpans"][0]["spans"]
    chats = [{a["key"]: a["value"] for a in s["attributes"]} for s in spans if s["name"].startswith("chat")]
    assert len(chats) == 7 and all("gen_ai.output.messages" in c for c in chats)
    second = json.loads(chats[1]["gen_ai.input.messages"]["stringValue"])
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    parts = [p for m in second for p in m["parts"]]
    assert {"type": "text", "content": "read notes.md"} in parts
    call = next(p for p in parts if p["type"] == "tool_call")
    assert call["name"] == "read_file" and call["arguments"]["path"] == 'notes "draft".md'
    assert {"type": "tool_call_response", "id": "", "response": "notes: ok"} in parts
    answer = json.loads(chats[0]["gen_ai.output.messages"]["stringValue"])
    assert answer[0]["role"] == "assistant" and answer[0]["finish_reason"] == "STOP"
    assert [p["type"] for p in answer[0]["parts"]] == ["reasoning", "text", "tool_call"]
    # Without --messages the spans carry none (the file stays small).
    plain = tmp_path / "p.jsonl"
    assert (
        amb(
            "export", "otel", "--store", str(genai_run.store), genai_run.run_id, "--out", str(plain)
        ).exit_code
        == 0
    )
    assert "gen_ai.input.messages" not in plain.read_text()


LINE_ENDS = "one\u2028two\u2029three\x85four\x1cfive\x1dsix\x1eseven"
"""Agent text holding every character ``str.splitlines()`` ends a line at that JSON may write raw."""


def test_jsonl_exports_keep_the_agents_line_ends_inside_their_lines(tmp_path):
    """An agent message holding U+2028, U+2029, U+0085 and U+001C-U+001E, exported as OTLP JSON
    lines, and a note holding them, exported in ATIF's events.jsonl (the agent's messages go to
    trajectory.json): read back with ``splitlines()`` line by line, each line is JSON and the text
    is the original."""
    trajectory = {
        "schema_version": "ATIF-v1.6",
        "session_id": "s",
        "agent": {"name": "a", "version": "1", "model_name": "m"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "hi", "timestamp": "2025-01-01T00:00:00Z"},
            {"step_id": 2, "source": "agent", "message": LINE_ENDS, "timestamp": "2025-01-01T00:00:01Z"},
            {"step_id": 3, "source": "system", "message": LINE_ENDS, "timestamp": "2025-01-01T00:00:02Z"},
        ],
    }
    given, root = tmp_path / "given.json", tmp_path / "store"
    given.write_text(json.dumps(trajectory), encoding="utf-8")
    r = amb("import", "atif", "--store", str(root), "--run-id", "lines", str(given))
    assert r.exit_code == 0, r.output

    otel = tmp_path / "t.jsonl"
    r = amb("export", "otel", "--store", str(root), "lines", "--messages", "--out", str(otel))
    assert r.exit_code == 0, r.output
    (line,) = otel.read_text(encoding="utf-8").splitlines()
    spans = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    (chat,) = [{a["key"]: a["value"] for a in s["attributes"]} for s in spans if s["name"].startswith("chat")]
    (answer,) = json.loads(chat["gen_ai.output.messages"]["stringValue"])
    assert [p["content"] for p in answer["parts"] if p["type"] == "text"] == [LINE_ENDS]

    r = amb("export", "atif", "--store", str(root), "lines", "--out", str(tmp_path / "atif"))
    assert r.exit_code == 0, r.output
    sidecar = tmp_path / "atif" / "lines" / "events.jsonl"
    events = [json.loads(x) for x in sidecar.read_text(encoding="utf-8").splitlines()]
    notes = [e["payload"] for e in events if e["kind"] == "note" and e["payload"]["data"].get("step_id") == 3]
    assert [n["text"] for n in notes] == [LINE_ENDS]


def test_parquet_export_lets_go_of_the_store_group_by_group(store, tmp_path):
    """What the export holds is bounded by a group of runs, not by the store: the views are written
    group by group (their pieces merged, then removed) and the database's cache of the file is
    emptied after each group, so at the end it holds a block at most (a read of every event leaves
    the whole file cached)."""
    from replay.export.parquet import export

    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    try:
        cached = "SELECT memory_usage_bytes FROM duckdb_memory() WHERE tag = 'BASE_TABLE'"
        threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
        written = {w.name: w for w in export(con, tmp_path / "pq", events_per_file=1)}
        assert con.execute(cached).fetchall()[0][0] <= 256 << 10
        tool_calls = con.execute("SELECT count(*) FROM tool_calls").fetchall()[0][0]
        assert written["tool_calls"].rows == tool_calls > 0
        assert not (tmp_path / "pq" / ".parts").exists()
        assert con.execute("SELECT current_setting('threads')").fetchall()[0][0] == threads
    finally:
        con.close()
