"""A Gemini placeholder key sent through the regular proxy to a host that is not its upstream stays
a placeholder. Its own module: one recording proxy runs per process, and this one opens the other
host with ``allow_hosts`` (the proxy refuses loopback destinations otherwise)."""

from __future__ import annotations

import httpx

from tests.fakes.harness import Recording
from tests.fakes.upstream import FakeUpstream

BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def test_a_placeholder_sent_elsewhere_through_the_regular_proxy_stays_a_placeholder(tmp_path):
    with FakeUpstream(prefix="/google") as gemini, FakeUpstream(host="127.0.0.3") as other:
        ups = {"openai": gemini.url, "anthropic": gemini.url, "gemini": gemini.url + "/google"}
        rec = Recording(tmp_path, gemini.url, upstreams=ups, allow_hosts=[("127.0.0.3", other.port)]).start()
        try:
            key = rec.custody.placeholders["gemini"]
            with httpx.Client(proxy=rec.regular) as client:
                r = client.post(f"{other.url}/v1beta/models/gem:generateContent?key={key}", json=BODY)
            assert r.status_code == 200
            assert other.requests[-1].path.endswith(f"?key={key}")  # not the real key
            assert not gemini.requests  # and the upstream saw nothing of it
        finally:
            rec.stop()
