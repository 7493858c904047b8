"""The replay endpoint (``amb replay serve``) against requests an agent on the same machine can send,
over loopback: a compressed body that decodes to gigabytes, a request to an API the recording never
called, and recorded timings no wait should take. Each is answered (a 4xx naming why, or the
recorded call), never a traceback, a dropped connection or a server asleep for hours."""

from __future__ import annotations

import gzip
import http.client
import json
import time
import zlib
from pathlib import Path

import brotli
import pytest
import zstandard

from replay.replayer.recorded import RecordedCall, canonical_text, lenient_text
from replay.replayer.server import MAX_WAIT_S, Replayer, ReplayServer, wait_s
from schemas.blobstore import BlobStore

REQUEST = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
RESPONSE = json.dumps({"id": "x", "object": "chat.completion", "choices": []}).encode()
STREAM_REQUEST = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
STREAM = b'data: {"id":"x","object":"chat.completion.chunk","choices":[]}\n\n' * 3 + b"data: [DONE]\n\n"


def chat_call(blobs: BlobStore, index: int = 0, stream: bool = False, **timing: float | None) -> RecordedCall:
    """A recorded Chat Completions call answering ``REQUEST`` with ``RESPONSE`` (a ``stream``:
    ``STREAM_REQUEST`` with ``STREAM``)."""
    request, response = (STREAM_REQUEST, STREAM) if stream else (REQUEST, RESPONSE)
    return RecordedCall(
        index=index,
        key=f"proxy:{index}",
        call_id=f"c{index}",
        api="chat.completions",
        provider="openai",
        stream=stream,
        status=200,
        ok=True,
        error=None,
        partial=False,
        request_blob=blobs.put(request).blob,
        response_blob=blobs.put(response).blob,
        response_media="text/event-stream" if stream else "application/json",
        ttfb_ms=timing.get("ttfb_ms"),
        latency_ms=timing.get("latency_ms"),
        body=request,
        canonical=canonical_text(request),
        lenient=lenient_text(canonical_text(request)),
    )


def serve(tmp_path: Path, calls_of, mode: str = "canonical", timing: str = "fast", **kw) -> ReplayServer:
    blobs = BlobStore(tmp_path / "blobs")
    return ReplayServer(Replayer(calls_of(blobs), blobs, mode, timing, **kw))


def post(server: ReplayServer, path: str, body: bytes, headers: dict[str, str] | None = None, timeout=30):
    con = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        con.request("POST", path, body=body, headers={"content-type": "application/json", **(headers or {})})
        r = con.getresponse()
        return r.status, r.read()
    finally:
        con.close()


ZEROS = b"\0" * (16 << 20)
BOMB_PIECES = 20
"""A bomb decodes to 20 × 16 MiB = 320 MiB, past the endpoint's 256 MiB."""


def deflate_bomb(wbits: int) -> bytes:
    """zlib's stream of 320 MiB of zeros, made from one 16 MiB piece: after a full flush the
    compressor forgets what it saw, so every further piece compresses to the same bytes (the
    checksum at the end is then wrong, and a decoder that stops at its limit never reaches it)."""
    o = zlib.compressobj(1, wbits=wbits)
    first, again = (o.compress(ZEROS) + o.flush(zlib.Z_FULL_FLUSH) for _ in range(2))
    return first + again * (BOMB_PIECES - 1) + o.flush()


def brotli_bomb() -> bytes:
    o = brotli.Compressor(quality=1)
    return b"".join(o.process(ZEROS) for _ in range(BOMB_PIECES)) + o.finish()


def zstd_bomb() -> bytes:
    return zstandard.ZstdCompressor().compress(ZEROS) * BOMB_PIECES  # concatenated frames are one body


@pytest.mark.parametrize(
    ("encoding", "bomb"),
    [
        ("gzip", lambda: gzip.compress(ZEROS, 1) * BOMB_PIECES),  # concatenated members are one body
        ("gzip", lambda: deflate_bomb(31)),
        ("deflate", lambda: deflate_bomb(15)),
        ("deflate", lambda: deflate_bomb(-15)),
        ("br", brotli_bomb),
        ("zstd", zstd_bomb),
        ("gzip, gzip", lambda: gzip.compress(gzip.compress(ZEROS, 1) * BOMB_PIECES, 1)),
    ],
    ids=["gzip-members", "gzip", "deflate", "raw-deflate", "br", "zstd", "gzip-twice"],
)
def test_a_compression_bomb_is_refused_with_413(tmp_path, encoding, bomb):
    """A body of kilobytes that decodes to 320 MiB: refused once its decoding passes the endpoint's
    256 MiB, not decoded whole; the endpoint then serves the recorded call as before."""
    raw = bomb()
    assert len(raw) < 2 * 1024 * 1024
    with serve(tmp_path, lambda blobs: [chat_call(blobs)]) as server:
        status, body = post(server, "/v1/chat/completions", raw, {"Content-Encoding": encoding})
        assert status == 413, body
        assert "decodes to more than 268,435,456 bytes" in json.loads(body)["error"]["message"]
        again = post(server, "/v1/chat/completions", gzip.compress(REQUEST), {"Content-Encoding": "gzip"})
        assert again == (200, RESPONSE)


@pytest.mark.parametrize(
    ("path", "title"),
    [
        ("/v1/messages", "Anthropic Messages API"),
        ("/v1/responses", "OpenAI Responses API"),
        ("/v1beta/models/gemini-2.5-pro:generateContent", "Gemini API's generateContent"),
    ],
)
def test_a_request_to_an_api_the_recording_never_called_says_so(tmp_path, path, title):
    """Not "no match" against a call of another API: the miss names the API the recording never
    called, and the ones it did."""
    with serve(tmp_path, lambda blobs: [chat_call(blobs)]) as server:
        status, body = post(server, path, REQUEST)
    message = json.loads(body)["error"]["message"]
    assert status == 400
    assert f"this recording has no calls to the {title} (it has: OpenAI Chat Completions API)" in message


def test_a_request_past_the_recorded_calls_of_its_api_says_they_were_served(tmp_path):
    with serve(tmp_path, lambda blobs: [chat_call(blobs)]) as server:
        assert post(server, "/v1/chat/completions", REQUEST) == (200, RESPONSE)
        status, body = post(server, "/v1/chat/completions", REQUEST)
    assert status == 400 and "every recorded chat.completions call has been served already" in body.decode()


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    "timing",
    [
        {"latency_ms": -5000.0},
        {"ttfb_ms": -5000.0, "latency_ms": 10.0},
        {"latency_ms": NAN},
        {"ttfb_ms": NAN, "latency_ms": NAN},
        {"latency_ms": INF},
        {"ttfb_ms": 1e15, "latency_ms": 1e15},
    ],
    ids=["negative", "negative-ttfb", "nan", "nan-both", "inf", "31000-years"],
)
def test_a_recorded_wait_is_capped_and_a_negative_or_nan_one_is_none(tmp_path, stream, timing):
    """``--timing original`` with recorded times no replay should wait: a negative or NaN one is no
    wait (``time.sleep`` raises on them), a huge one waits the cap (here 0.3 s; 10 minutes by
    default), and the recorded answer comes back whole."""
    calls = lambda blobs: [chat_call(blobs, stream=stream, **timing)]  # noqa: E731
    with serve(tmp_path, calls, "sequence", "original", max_wait_s=0.3) as server:
        t0 = time.monotonic()
        got = post(server, "/v1/chat/completions", STREAM_REQUEST if stream else REQUEST, timeout=10)
        took = time.monotonic() - t0
    assert got == (200, STREAM if stream else RESPONSE)
    assert took < 3


def test_the_longest_wait_is_ten_minutes():
    assert MAX_WAIT_S == 600
    assert wait_s(1e15, MAX_WAIT_S) == 600 and wait_s(INF, MAX_WAIT_S) == 600
    assert wait_s(-1, MAX_WAIT_S) == wait_s(NAN, MAX_WAIT_S) == wait_s(None, MAX_WAIT_S) == 0
    assert wait_s(1500, MAX_WAIT_S) == 1.5


def test_a_chunked_request_is_served_and_an_oversized_one_refused(tmp_path):
    """The endpoint reads bodies through the HTTP layer: a chunked request is matched like any
    other; a Content-Length above 256 MiB is a 413 in the API's error shape, its body unread."""
    with serve(tmp_path, lambda blobs: [chat_call(blobs)]) as server:
        con = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        con.request(
            "POST", "/v1/chat/completions", body=iter([REQUEST[:10], REQUEST[10:]]), encode_chunked=True
        )
        r = con.getresponse()
        assert (r.status, r.read()) == (200, RESPONSE)
        con.close()
        status, body = post(server, "/v1/messages", b"", {"Content-Length": str(256 * 1024 * 1024 + 1)})
    error = json.loads(body)
    assert (
        status == 413
        and error["type"] == "error"
        and "this server reads 256 MiB" in error["error"]["message"]
    )
