"""The LLM judge against a loopback OpenAI-compatible server: real ``openai`` client, real HTTP."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from schemas.events import (
    AssistantMessage,
    ModelCallCompleted,
    RunStarted,
    ToolCallPart,
    ToolCallRequested,
    ToolCallResult,
)
from scorer.evidence import build
from scorer.judge.cache import JudgeCache
from scorer.judge.llm import LLMJudge
from scorer.profile import load
from scorer.trajectory import fold
from tests.fakes import judge_server as fake
from tests.fakes.events import unsigned_events


def _events():
    payloads = [
        RunStarted(task="kidney-seg", tier="standard", agent="a", model="m"),
        ModelCallCompleted(
            call_id="c0",
            provider="openai",
            api="chat.completions",
            model="m",
            message=AssistantMessage(
                text="plan",
                tool_calls=[
                    ToolCallPart(
                        id="t0", name="execute_code", arguments='{"language":"python","code":"print(1)"}'
                    )
                ],
            ),
        ),
        ToolCallRequested(
            tool_call_id="t0",
            name="execute_code",
            arguments='{"language":"python","code":"print(1)"}',
            model_call_id="c0",
        ),
        ToolCallResult(
            tool_call_id="t0", model_call_id="c1", output='{"exit_code": 0, "stdout": "1", "stderr": ""}'
        ),
    ]
    return unsigned_events("r1", "proxy", payloads, start_ns=1000)


def _setup(monkeypatch, server, *, timeout=5.0, retries=0, cache=None):
    monkeypatch.setenv("AMB_JUDGE_BASE_URL", server.base_url)
    monkeypatch.setenv("AMB_JUDGE_MODEL", "fake-judge")
    monkeypatch.setenv("AMB_JUDGE_API_KEY", "test-key")
    prof = load("paper-2026-06").profile
    settings = msgspec.structs.replace(prof.judge, timeout_s=timeout, max_retries=retries)
    traj = fold("r1", _events(), lambda ref: b"")
    evidence = build(traj, prof.evidence, lambda ref: b"", track="segmentation", grade=None)
    stored: list[Any] = []
    judge = LLMJudge(settings, cache if cache is not None else JudgeCache(), stored.append)
    items = [i for i in prof.items_for("segmentation", "standard") if i.id in ("s2b", "s3")]
    return judge, traj, evidence, items


def test_valid_verdicts_settings_and_citations(monkeypatch):
    def policy(req):
        item = fake.asked_item(req)
        return fake.verdict(item, 0.5 if item == "s3" else 1, evidence=["proxy:2", "[proxy:3]", "proxy:999"])

    with fake.JudgeServer(policy) as server:
        judge, traj, evidence, items = _setup(monkeypatch, server)
        out = judge.judge(traj, evidence, items, track="segmentation")
    assert out["s2b"].value == 1.0 and out["s3"].value == 0.5
    assert out["s3"].cited == ["proxy:2", "proxy:3"]  # proxy:999 is not in the evidence: dropped
    assert out["s3"].judge == "llm:fake-judge"
    req = server.requests[0]
    assert (
        req["temperature"] == 0
        and req["seed"] == 20260601
        and req["response_format"] == {"type": "json_object"}
    )
    assert "<<<EVIDENCE" in fake.user_text(req) and "Offered values: [0, 1]" in fake.user_text(req)


def test_last_verdict_wins(monkeypatch):
    reply = 'Thinking: {"item": "s2b", "value": 1}\nFinal: {"item": "s2b", "value": 0, "reason": "no check"}'
    with fake.JudgeServer(lambda req: fake.Reply(content=reply)) as server:
        judge, traj, evidence, items = _setup(monkeypatch, server)
        out = judge.judge(traj, evidence, items[:1], track="segmentation")
    assert out["s2b"].value == 0.0 and out["s2b"].reason == "no check"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (fake.Reply(content="{'item': s2b, value: one"), "parse_failure"),
        (fake.Reply(content='{"item": "s2b", "value": 0.7}'), "value_out_of_range"),
        (fake.Reply(content='{"item": "s2b", "value": true}'), "value_out_of_range"),
        (fake.Reply(content='{"item": "s2b", "value": 2}'), "value_out_of_range"),
        (fake.Reply(content='{"item": "s9", "value": 1}'), "wrong_item"),
        (fake.Reply(content=""), "empty_reply"),
        (fake.Reply(content=None, refusal="I can't help with grading this."), "refusal"),
        (fake.Reply(content="", finish_reason="content_filter"), "refusal"),
        (
            fake.Reply(content='{"item": "s2b", "value": 1, "x": ' + "[" * 10**5 + "]" * 10**5 + "}"),
            "parse_failure",
        ),
        (fake.Reply(content='{"item": "s2b", "value": NaN}'), "value_out_of_range"),
    ],
    ids=[
        "malformed-json",
        "between-values",
        "boolean",
        "above-range",
        "wrong-item",
        "empty",
        "refusal",
        "content-filter",
        "nested-too-deep",
        "not-a-number",
    ],
)
def test_bad_replies_are_unscored_not_zero(monkeypatch, reply, reason):
    with fake.JudgeServer(lambda req: reply) as server:
        cache = JudgeCache()
        judge, traj, evidence, items = _setup(monkeypatch, server, cache=cache)
        out = judge.judge(traj, evidence, items[:1], track="segmentation")
        assert out["s2b"].value is None and out["s2b"].unscored_reason == reason
        # A deterministic failure is cached like a verdict: asking again makes no request.
        judge.judge(traj, evidence, items[:1], track="segmentation")
        assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (fake.Reply(content="{}", delay_s=1.0), "timeout"),
        (fake.Reply(status=503), "http_503"),
        (fake.Reply(raw_body="<html>not json</html>"), "bad_response"),
    ],
    ids=["timeout", "http-503", "non-json-body"],
)
def test_transport_failures_are_unscored_and_not_cached(monkeypatch, reply, reason):
    with fake.JudgeServer(lambda req: reply) as server:
        cache = JudgeCache()
        judge, traj, evidence, items = _setup(monkeypatch, server, timeout=0.3, cache=cache)
        out = judge.judge(traj, evidence, items[:1], track="segmentation")
        assert out["s2b"].value is None
        if reason:
            assert out["s2b"].unscored_reason == reason
            judge.judge(traj, evidence, items[:1], track="segmentation")
            assert len(server.requests) == 2  # asked again: a transport failure is never a cached verdict
        records = cache.drain()
        assert records and all(
            r.request["messages"][1]["content"].count("{{evidence:sha256:") == 1 for r in records
        )


def test_cache_hits_make_no_request(monkeypatch):
    with fake.JudgeServer(lambda req: fake.verdict(fake.asked_item(req), 1)) as server:
        cache = JudgeCache()
        judge, traj, evidence, items = _setup(monkeypatch, server, cache=cache)
        first = judge.judge(traj, evidence, items, track="segmentation")
        assert len(server.requests) == 2
        second = judge.judge(traj, evidence, items, track="segmentation")
        assert len(server.requests) == 2
    assert all(v.cached for v in second.values()) and not any(v.cached for v in first.values())
    assert {k: v.value for k, v in first.items()} == {k: v.value for k, v in second.items()}
    rec = cache.drain()[0]
    assert json.loads(rec.response)["object"] == "chat.completion" and rec.reply_text


def test_no_endpoint_is_a_clear_error(monkeypatch):
    from schemas.errors import UsageError

    for var in ("AMB_JUDGE_BASE_URL", "AMB_JUDGE_MODEL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UsageError, match="AMB_JUDGE_BASE_URL"):
        LLMJudge(load("paper-2026-06").profile.judge, JudgeCache(), lambda e: None)


def test_error_codes_from_the_judge_must_cite_evidence(monkeypatch):
    reply = json.dumps(
        {
            "codes": [
                {"code": "E4", "evidence": ["proxy:3"], "reason": "a failing step"},
                {"code": "E2", "evidence": ["proxy:777"], "reason": "cites nothing real"},
                {"code": "E9", "evidence": ["proxy:3"], "reason": "not a code"},
                {"code": "E1", "evidence": [], "reason": "no evidence"},
            ]
        }
    )
    with fake.JudgeServer(lambda req: fake.Reply(content=reply)) as server:
        cache = JudgeCache()
        judge, traj, evidence, _ = _setup(monkeypatch, server, cache=cache)
        codes, why = judge.codes(traj, evidence)
        assert why is None and codes == [{"code": "E4", "events": ["proxy:3"], "reason": "a failing step"}]
        assert judge.codes(traj, evidence)[0] == codes and len(server.requests) == 1  # cached
        assert "E1 understanding" in server.requests[0]["messages"][0]["content"]


def test_error_codes_reply_unparseable(monkeypatch):
    with fake.JudgeServer(lambda req: fake.Reply(content="E3, I think")) as server:
        judge, traj, evidence, _ = _setup(monkeypatch, server)
        assert judge.codes(traj, evidence) == ([], "parse_failure")


def test_plan_png_goes_to_the_figure_item_as_an_image(monkeypatch):
    from schemas.blob import BlobRef, digest
    from schemas.events import FileWritten

    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
    plan = b"# Plan\n1. load -> 2. infer -> 3. write\n"
    blobs = {digest(png): png, digest(plan): plan}
    extra = [
        FileWritten(
            path="plan/plan.md",
            size=len(plan),
            sha256=digest(plan),
            content=BlobRef(blob=digest(plan), size=len(plan)),
        ),
        FileWritten(
            path="plan/plan.png",
            size=len(png),
            sha256=digest(png),
            content=BlobRef(blob=digest(png), size=len(png)),
        ),
    ]
    evs = _events() + unsigned_events("r1", "shim", extra, start_ns=2000)
    with fake.JudgeServer(lambda req: fake.verdict(fake.asked_item(req), 1, evidence=["shim:1"])) as server:
        monkeypatch.setenv("AMB_JUDGE_BASE_URL", server.base_url)
        monkeypatch.setenv("AMB_JUDGE_MODEL", "fake-judge")
        prof = load("paper-2026-06").profile

        def get(ref):
            return blobs[ref.blob]

        traj = fold("r1", evs, get)
        evidence = build(traj, prof.evidence, get, track="segmentation", grade=None)
        assert "## plan.md [shim:0]" in evidence.text and "load -> 2. infer" in evidence.text
        items = [i for i in prof.items_for("segmentation", "standard") if i.id in ("s1a", "s1f")]
        out = LLMJudge(prof.judge, JudgeCache(), lambda e: None).judge(
            traj, evidence, items, track="segmentation"
        )
    by_item = {fake.asked_item(r): r for r in server.requests}
    assert isinstance(by_item["s1a"]["messages"][1]["content"], str)
    parts = by_item["s1f"]["messages"][1]["content"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert out["s1f"].cited == ["shim:1"]


def test_a_plan_png_too_large_to_look_at_is_stated_not_read_or_sent():
    from schemas.blob import BlobRef, digest
    from schemas.events import FileWritten
    from scorer.evidence import PLAN_IMAGE_MAX

    huge = b"\x89PNG\r\n\x1a\n" + b"\0" * PLAN_IMAGE_MAX
    small_claim = b"\x89PNG\r\n\x1a\n" + b"\1" * PLAN_IMAGE_MAX  # its event says 10 bytes
    prof = load("paper-2026-06").profile
    for data, size, reads in ((huge, len(huge), 0), (small_claim, 10, 1)):
        ref = BlobRef(blob=digest(data), size=len(data))
        written = FileWritten(path="plan/plan.png", size=size, sha256=digest(data), content=ref)
        evs = _events() + unsigned_events("r1", "shim", [written], start_ns=2000)
        asked: list[str] = []

        def get(ref, data=data, asked=asked):
            asked.append(ref.blob)
            return data

        evidence = build(
            fold("r1", evs, lambda ref: b""), prof.evidence, get, track="segmentation", grade=None
        )
        line = f"## plan.png [shim:0] {len(data) if reads else size} bytes: too large to look at (over 5 MiB)"
        assert line in evidence.text and evidence.images == [], evidence.text
        assert len(asked) == reads  # a recorded size over the limit: the blob is not even read
