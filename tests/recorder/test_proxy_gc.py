"""The running proxy keeps what it was built from out of the cyclic collector's full passes: each
pass walked ~85k long-lived objects while holding the GIL, a pause every stream felt."""

from __future__ import annotations

import gc

import httpx

from tests.fakes.harness import Recording
from tests.fakes.upstream import FakeUpstream


def test_startup_objects_are_frozen_while_the_proxy_runs_and_released_after(tmp_path):
    with FakeUpstream() as fake:
        gc.unfreeze()
        rec = Recording(tmp_path, fake.url).start()
        try:
            frozen = gc.get_freeze_count()
            assert frozen > 10_000  # mitmproxy, cryptography and the recorder's own modules
            r = httpx.post(
                rec.base + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert r.status_code == 200 and rec.new_payloads("model_call.completed")
            gc.collect()  # a full pass while recording leaves the frozen objects frozen
            assert gc.get_freeze_count() > frozen * 0.9  # (some are freed by reference counting)
        finally:
            rec.stop()
        assert gc.get_freeze_count() == 0
