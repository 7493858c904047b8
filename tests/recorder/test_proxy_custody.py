"""Credential custody: keys go only to their provider's upstream, and never into the record."""

from __future__ import annotations

import random

import pytest
from mitmproxy.http import Headers

from recorder.proxy.custody import ANCHOR_LIMIT, REDACTED, Custody, contains

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
    a = Headers([(b"x-api-key", c.placeholders["anthropic"].encode())])
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


@pytest.mark.parametrize(
    "needle", [b"sk-proj-Ab3_xYz9", b"-leading-dash", b"under_score_only", b"plainalnum0123"]
)
def test_contains_is_exactly_in(needle):
    # The anchored search against Python's own: keys at either end, partial keys around anchors,
    # fewer and more anchors than the limit, the key right after the limit's last anchor.
    rng = random.Random(needle)
    alphabet = b"ABCxyz019+/=" + needle[:3]
    for trial in range(400):
        n_anchor = rng.choice([0, 1, ANCHOR_LIMIT - 1, ANCHOR_LIMIT, ANCHOR_LIMIT + 1, 200])
        parts = [bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))]
        for _ in range(n_anchor):
            parts.append(rng.choice([b"-", b"_", needle[:-1], needle[1:]]))
            parts.append(bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 5))))
        where = rng.choice(["none", "start", "end", "middle"])
        if where == "start":
            parts.insert(0, needle)
        elif where == "end":
            parts.append(needle)
        elif where == "middle":
            parts.insert(rng.randrange(len(parts) + 1), needle)
        data = b"".join(parts)
        assert contains(data, needle) == (needle in data), (trial, data)


def test_scrub_of_a_large_image_body_finds_a_key_hidden_in_it():
    c = Custody.from_env(ENV, UP)
    image = b"QUJD" * 500_000
    body = b'{"url": "data:image/png;base64,' + image + ENV["OPENAI_API_KEY"].encode() + image + b'"}'
    scrubbed = c.scrub(body)
    assert ENV["OPENAI_API_KEY"].encode() not in scrubbed and REDACTED.encode() in scrubbed
    assert c.scrub(body.replace(ENV["OPENAI_API_KEY"].encode(), b"")) == body.replace(
        ENV["OPENAI_API_KEY"].encode(), b""
    )
