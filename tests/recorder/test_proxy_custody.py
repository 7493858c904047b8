"""Credential custody: keys go only to their provider's upstream, and never into the record."""

from __future__ import annotations

from mitmproxy.http import Headers

from recorder.proxy.custody import REDACTED, Custody

ENV = {"OPENAI_API_KEY": "sk-real-openai-0123456789", "ANTHROPIC_API_KEY": "sk-ant-real-9876543210"}
UP = {"openai": "https://api.openai.com", "anthropic": "http://gateway.local:8080"}


def test_placeholder_is_swapped_only_for_the_configured_upstream():
    c = Custody.from_env(ENV, UP)
    ph = c.placeholders["openai"]
    h = Headers(authorization=f"Bearer {ph}")
    assert c.inject("api.openai.com", 443, h) and h["authorization"] == "Bearer sk-real-openai-0123456789"
    elsewhere = Headers(authorization=f"Bearer {ph}")
    assert not c.inject("evil.example", 443, elsewhere) and elsewhere["authorization"] == f"Bearer {ph}"
    wrong_port = Headers(authorization=f"Bearer {ph}")
    assert not c.inject("api.openai.com", 80, wrong_port)
    a = Headers(**{"x-api-key": c.placeholders["anthropic"]})
    assert c.inject("gateway.local", 8080, a) and a["x-api-key"] == ENV["ANTHROPIC_API_KEY"]


def test_an_agents_own_key_is_left_alone():
    c = Custody.from_env(ENV, UP)
    h = Headers(authorization="Bearer sk-agents-own")
    assert not c.inject("api.openai.com", 443, h) and h["authorization"] == "Bearer sk-agents-own"


def test_no_real_key_means_nothing_to_inject():
    c = Custody.from_env({}, UP)
    assert c.placeholders["openai"].startswith("amb-placeholder-openai-")
    h = Headers(authorization=f"Bearer {c.placeholders['openai']}")
    assert not c.inject("api.openai.com", 443, h)


def test_scrub_masks_key_bytes_everywhere():
    c = Custody.from_env(ENV, UP)
    body = b'{"echo": "my key is sk-real-openai-0123456789 and sk-ant-real-9876543210"}'
    out = c.scrub(body)
    assert b"sk-real" not in out and b"sk-ant-real" not in out and out.count(REDACTED.encode()) == 2
    assert c.scrub_text("x sk-real-openai-0123456789") == f"x {REDACTED}"
    short = Custody.from_env({"OPENAI_API_KEY": "abc"}, UP)  # too short to mask without mangling bodies
    assert short.scrub(b"abcabc") == b"abcabc"
