"""Failures are recorded, never dropped: upstream errors and resets, clients leaving, dead
upstreams, the recorder shutting down mid-stream, and persistence failing (fail closed)."""

from __future__ import annotations

import os
import socket
import threading

import httpx
import openai
import pytest

from schemas.events import ModelCallCompleted, NetworkRequest
from tests.fakes.harness import Recording
from tests.fakes.upstream import TEXT

CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def rec(fake, tmp_path):
    # One per test: mitmproxy keeps its master in a process-wide context, so two proxies may not
    # be alive in one process at once (amb-record runs exactly one).
    r = Recording(tmp_path, fake.url).start()
    yield r
    r.stop()


def last_call(rec) -> ModelCallCompleted:
    calls = [p for p in rec.new_payloads("model_call.completed") if isinstance(p, ModelCallCompleted)]
    assert len(calls) == 1, calls
    return calls[0]


def disk_full(rec) -> None:
    """From now on every write to the proxy's spool fails with ENOSPC, as on a full disk."""
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, rec.sink.spool._fd)
    os.close(full)


def test_upstream_500_is_a_recorded_failure(rec):
    client = openai.OpenAI(base_url=rec.base + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[], extra_headers={"x-fake-status": "500"})
    call = last_call(rec)
    assert (call.ok, call.status, call.partial) == (False, 500, False)
    assert call.error == "http_500: fake upstream failure 500"


def test_upstream_reset_mid_stream(rec):
    headers = {"x-fake-chunks": "10", "x-fake-reset-after": "4"}
    received = b""
    with pytest.raises(httpx.HTTPError):
        with (
            httpx.Client() as c,
            c.stream("POST", rec.base + "/v1/chat/completions", json=CHAT, headers=headers) as r,
        ):
            for chunk in r.iter_bytes():
                received += chunk
    call = last_call(rec)
    assert (call.ok, call.partial, call.status) == (False, True, 200)
    assert call.error is not None
    assert call.error.startswith("upstream_reset")
    assert call.message.text and TEXT.startswith(call.message.text) and call.message.text != TEXT
    assert rec.blobs.get(call.response) == received  # what the client got before the cut


def test_client_disconnect_mid_stream(rec):
    headers = {"x-fake-chunks": "30", "x-fake-delay-ms": "40"}
    with (
        httpx.Client() as c,
        c.stream("POST", rec.base + "/v1/chat/completions", json=CHAT, headers=headers) as r,
    ):
        it = r.iter_raw()
        next(it), next(it)
    call = last_call(rec)
    assert (call.ok, call.partial, call.error) == (False, True, "client_disconnected")
    assert TEXT.startswith(call.message.text) and len(call.message.text) < len(TEXT)


def test_dead_upstream_gives_502_and_a_record(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    rec = Recording(tmp_path, dead).start()
    try:
        r = httpx.post(rec.base + "/v1/chat/completions", json={**CHAT, "stream": False})
        assert r.status_code == 502
        call = last_call(rec)
        assert (call.ok, call.status) == (False, None)
        assert call.error is not None
        assert call.error.startswith("upstream_unreachable")
    finally:
        rec.stop()


def test_shutdown_mid_stream_saves_a_partial_record(fake, tmp_path):
    rec = Recording(tmp_path, fake.url).start()
    got: list[bytes] = []
    midway = threading.Event()  # set at the third chunk, or when the client gives up early

    def client() -> None:
        headers = {"x-fake-chunks": "40", "x-fake-delay-ms": "50"}
        try:
            with (
                httpx.Client() as c,
                c.stream("POST", rec.base + "/v1/chat/completions", json=CHAT, headers=headers) as r,
            ):
                for chunk in r.iter_raw():
                    got.append(chunk)
                    if len(got) >= 3:
                        midway.set()
        except httpx.HTTPError:
            pass
        finally:
            midway.set()

    t = threading.Thread(target=client)
    t.start()
    assert midway.wait(30) and len(got) >= 3, f"the stream did not get going: {len(got)} chunks"
    rec.stop()
    t.join(10)
    (call,) = [e.payload for e in rec.events() if e.kind == "model_call.completed"]
    assert (call.ok, call.partial, call.error) == (False, True, "recorder_shutdown")
    assert call.message.text and TEXT.startswith(call.message.text)


def test_a_stopped_proxy_closes_its_ports(fake, tmp_path):
    rec = Recording(tmp_path, fake.url).start()
    ports = sorted(set(rec.proxy.ports.values()))
    assert httpx.post(rec.base + "/v1/chat/completions", json={**CHAT, "stream": False}).status_code == 200
    rec.stop()
    for port in ports:
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


def test_fails_closed_when_the_spool_cannot_be_written(fake, tmp_path):
    rec = Recording(tmp_path, fake.url).start()
    try:
        disk_full(rec)
        r = httpx.post(rec.base + "/v1/chat/completions", json={**CHAT, "stream": False})
        assert r.status_code == 502 and "could not persist" in r.json()["error"]["message"]
        n = len(fake.requests)
        r = httpx.post(rec.base + "/v1/chat/completions", json={**CHAT, "stream": False})
        assert r.status_code == 503 and "refusing" in r.json()["error"]["message"]
        assert len(fake.requests) == n  # nothing further was forwarded unrecorded
        assert rec.sink.broken
    finally:
        rec.proxy.stop()


def test_fails_closed_for_a_stream(fake, tmp_path):
    rec = Recording(tmp_path, fake.url).start()
    try:
        disk_full(rec)
        with pytest.raises(httpx.HTTPError):  # the stream is cut before its end: the client sees an error
            with httpx.Client() as c, c.stream("POST", rec.base + "/v1/chat/completions", json=CHAT) as r:
                for _ in r.iter_bytes():
                    pass
    finally:
        rec.proxy.stop()


def test_other_traffic_is_a_network_request(rec, fake):
    with httpx.Client(proxy=rec.regular) as c:
        small = c.get(fake.url + "/bytes/1000")
        big = c.get(fake.url + "/bytes/2000000")
        posted = c.post(fake.url + "/upload", content=b"payload")
    assert small.status_code == big.status_code == posted.status_code == 200, rec.sink.broken
    nets = [p for p in rec.new_payloads("network.request", wait_for=3) if isinstance(p, NetworkRequest)]
    by_path = {n.path: n for n in nets}
    s, b, p = by_path["/bytes/1000"], by_path["/bytes/2000000"], by_path["/upload"]
    assert (s.method, s.host, s.status, s.response_bytes) == ("GET", "127.0.0.1", 200, 1000)
    assert rec.blobs.get(s.response_body) == small.content
    assert (
        b.response_bytes == 2_000_000 and b.response_body is None and b.response_sha256
    )  # over the cap: hash only
    assert p.request_bytes == 7 and rec.blobs.get(p.request_body) == b"payload"
    assert all(n.duration_ms is not None and n.via == "proxy" for n in nets)


def test_a_request_body_nested_100000_deep_is_still_recorded(rec):
    """The agent writes the request body: JSON nested deeper than any decoder's recursion is kept as
    an opaque body, and the call is recorded whatever the upstream makes of it."""
    deep = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with httpx.Client() as c:
        answer = c.post(
            rec.base + "/v1/chat/completions", content=deep, headers={"content-type": "application/json"}
        )
    call = last_call(rec)
    assert answer.status_code == 400 and (call.status, call.ok) == (400, False)
    assert call.request is not None and call.request.size == len(deep)


def raw_exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` as bytes (no client library would send them) and read the answer to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_request_line_bytes_that_are_not_utf8_are_recorded_not_fatal(rec, fake):
    """The agent writes the request line: a byte that is not UTF-8 in a model call's query, another
    path or the method is recorded percent-encoded, and the recording goes on."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    head = b"\r\nHost: x\r\nConnection: close\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    port = rec.proxy.ports["openai"]
    for line in (
        b"POST /v1/chat/completions?a=\xff",
        b"POST /v1/chat/\xfe\xff",
        b"PO\xffST /v1/chat/completions",
    ):
        answer = raw_exchange(port, line + b" HTTP/1.1" + head % len(body) + body)
        assert not answer.startswith(b"HTTP/1.1 503"), (line, answer[:300])
    assert rec.sink.broken is None
    payloads = rec.new_payloads("network.request", wait_for=2)
    calls = [p for p in payloads if isinstance(p, ModelCallCompleted)]
    nets = {(n.method, n.path) for n in payloads if isinstance(n, NetworkRequest)}
    assert [c.url for c in calls] == [fake.url + "/v1/chat/completions?a=%FF"]
    assert {("POST", "/v1/chat/%FE%FF"), ("PO%FFST", "/v1/chat/completions")} <= nets
