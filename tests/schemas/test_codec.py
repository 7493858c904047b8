"""Round trip of every event kind through the canonical encoding, and the codec's contract."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec
import pytest

from schemas.blob import BlobRef
from schemas.codec import (
    GENESIS,
    canonical_digest,
    canonical_json,
    check_id,
    decode_body,
    decode_event,
    decode_payload,
    encode_payload,
    hash_body,
    json_line,
    make_body,
)
from schemas.errors import NewerEventVersion, SchemaError, UnknownEventKind
from schemas.events import (
    ALL_KINDS,
    AssistantMessage,
    FileAccessed,
    FileDeleted,
    FileRenamed,
    FileWritten,
    ModelCallCompleted,
    NetworkRequest,
    Note,
    ProcessExited,
    RunFinished,
    RunStarted,
    SealedFile,
    SubmissionSealed,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
    Usage,
    kind_of,
)

REF = BlobRef(blob="sha256:" + "ab" * 32, size=12, media_type="application/json")

SAMPLES = [
    RunStarted(task="kidney-seg", tier="lite", agent="a", model="m", command=["x", "--y"], labels={"k": "v"}),
    RunFinished(status="timeout", exit_code=124, duration_s=3.5, reason="time limit", counts={"proxy": 3}),
    ModelCallCompleted(
        call_id="c1",
        provider="openai",
        api="chat.completions",
        model="gpt",
        stream=True,
        status=200,
        request=REF,
        response=REF,
        message=AssistantMessage(
            text="héllo ✓",
            reasoning="think",
            tool_calls=[ToolCallPart(id="t1", name="f", arguments='{"a": 1')],
        ),
        stop_reason="tool_calls",
        usage=Usage(input_total=100, cache_read=40, output=20, reasoning=5, reported=False),
        ttfb_ms=1.25,
        latency_ms=9.5,
    ),
    ToolCallRequested(tool_call_id="t1", name="f", arguments='{"a": 1', model_call_id="c1"),
    ToolCallResult(
        tool_call_id="t1", model_call_id="c2", output="out\n\x00\u2028", output_blob=REF, is_error=False
    ),
    ProcessExited(
        pid=7, ppid=1, argv=["python3", "-c", "print('\"')"], cwd="/w", start_ns=1, end_ns=2, exit_code=0
    ),
    FileWritten(path="plan/plan.md", op="created", size=3, sha256="sha256:" + "00" * 32, content=REF),
    FileDeleted(path="a b.txt"),
    FileRenamed(src="a", dst="b"),
    FileAccessed(path="/data/private/x", mode="r", pid=3),
    NetworkRequest(method="GET", scheme="https", host="pypi.org", port=443, path="/simple/", status=200),
    SubmissionSealed(
        root="/w", files=[SealedFile(path="o.json", size=2, sha256="sha256:" + "11" * 32, content=REF)]
    ),
    Note(text="n", data={"x": [1, 2.5, None]}),
]


def test_samples_cover_every_kind():
    assert {type(s) for s in SAMPLES} == set(ALL_KINDS)


@pytest.mark.parametrize("payload", SAMPLES, ids=lambda p: kind_of(type(p)))
def test_round_trip(payload):
    kind = kind_of(type(payload))
    body = make_body(
        run_id="run-1",
        source="proxy",
        seq=4,
        ts_ns=123,
        kind=kind,
        v=type(payload).VERSION,
        payload=encode_payload(payload),
        prev_hash=GENESIS,
    )
    event = decode_event(body)
    assert event.payload == payload
    assert (event.kind, event.seq, event.run_id, event.source, event.ts_ns) == (
        kind,
        4,
        "run-1",
        "proxy",
        123,
    )
    assert event.hash == "sha256:" + hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("payload", SAMPLES, ids=lambda p: kind_of(type(p)))
def test_body_is_canonical_json(payload):
    """The hand-assembled body equals a generic sorted, compact re-encoding of itself."""
    body = make_body(
        run_id="r",
        source="shim",
        seq=0,
        ts_ns=1,
        kind=kind_of(type(payload)),
        v=1,
        payload=encode_payload(payload),
        prev_hash=GENESIS,
    )
    assert msgspec.json.encode(msgspec.json.decode(body), order="sorted") == body
    assert json.loads(body)["payload"]["kind"] == kind_of(type(payload))


@pytest.mark.parametrize("payload", SAMPLES[:3], ids=lambda p: kind_of(type(p)))
def test_a_values_canonical_json_is_its_payload_encoding(payload):
    """One canonical form: a payload's stored bytes, and what every digest of a value is taken over
    (sorted keys at every level, no whitespace, UTF-8 as it is)."""
    assert canonical_json(payload) == encode_payload(payload)
    value = {"b": [1.5, {"z": None, "é": "ü"}], "a": True}
    assert canonical_json(value) == '{"a":true,"b":[1.5,{"z":null,"é":"ü"}]}'.encode()
    assert canonical_digest(value) == "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def test_payloads_are_immutable():
    with pytest.raises(AttributeError):
        SAMPLES[0].task = "other"  # type: ignore[attr-defined]  # the point: no assignment gets through


def test_stored_payload_keeps_defaults():
    """omit_defaults would let a later default change rewrite history; every field is stored."""
    assert json.loads(encode_payload(FileDeleted(path="x"))) == {
        "kind": "file.deleted",
        "path": "x",
        "changed_ns": None,
    }
    assert "usage" in json.loads(encode_payload(SAMPLES[2]))
    assert json.loads(encode_payload(RunFinished(status="completed")))["exit_code"] is None


def test_hash_covers_every_envelope_field():
    base: dict[str, Any] = dict(
        run_id="r",
        source="proxy",
        seq=1,
        ts_ns=5,
        kind="note",
        v=2,
        payload=encode_payload(Note(text="a")),
        prev_hash=GENESIS,
    )
    h = hash_body(make_body(**base))
    for field, other in [
        ("run_id", "r2"),
        ("source", "shim"),
        ("seq", 2),
        ("ts_ns", 6),
        ("v", 1),
        ("payload", encode_payload(Note(text="b"))),
        ("prev_hash", "sha256:" + "1" * 64),
    ]:
        assert hash_body(make_body(**(base | {field: other}))) != h, field


def test_unknown_kind_is_a_clear_error():
    body = make_body(
        run_id="r",
        source="proxy",
        seq=0,
        ts_ns=1,
        kind="judge.verdict",
        v=1,
        payload=b'{"kind":"judge.verdict"}',
        prev_hash=GENESIS,
    )
    env = decode_body(body)
    with pytest.raises(UnknownEventKind, match="unknown event kind 'judge.verdict'"):
        decode_payload(env.kind, env.v, env.payload)


def test_newer_version_is_a_clear_error():
    with pytest.raises(NewerEventVersion, match="upgrade amb"):
        decode_payload("note", 3, b'{"kind":"note","text":"x"}')


def test_old_version_is_upcast():
    assert decode_payload("note", 1, b'{"kind":"note","message":"hi"}') == Note(text="hi", data={})


def test_malformed_payload_is_a_schema_error():
    with pytest.raises(SchemaError, match="malformed file.deleted"):
        decode_payload("file.deleted", 1, b'{"kind":"file.deleted","path":3}')
    with pytest.raises(SchemaError, match="does not match envelope kind"):
        decode_payload("file.deleted", 1, b'{"kind":"note","text":"x"}')
    with pytest.raises(SchemaError, match="envelope"):
        decode_body(b"not json")


@pytest.mark.parametrize("bad", ["", "a b", 'x"y', "a\\b", "é", "-x", "x" * 129])
def test_ids_are_restricted(bad):
    with pytest.raises(SchemaError):
        check_id("run id", bad)


@pytest.mark.parametrize("end", ["\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_a_json_line_escapes_what_splitlines_ends_a_line_at(end):
    value = {"text": f"a{end}b", "list": [end, "é ✓ \U0001f600"], end: 1}
    line = json_line(value)
    assert line.splitlines() == [line] and f"\\u{ord(end):04x}" in line
    assert json.loads(line) == value
    # Only the line ends are written differently from the canonical JSON.
    assert line.replace(f"\\u{ord(end):04x}", end) == canonical_json(value).decode().replace(
        f"\\u{ord(end):04x}", end
    )
