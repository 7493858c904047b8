"""Content decoding and SSE splitting: the parts every recorded stream goes through."""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from recorder.proxy.wire import decode_content, iter_sse

BODY = ('data: {"x": "é🙂"}\n\n' * 200).encode()


def _encode(coding: str, data: bytes) -> bytes:
    if coding == "gzip":
        return gzip.compress(data)
    if coding == "deflate":
        return zlib.compress(data)
    if coding == "br":
        return brotli.compress(data)
    return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_decode_each_coding(coding):
    assert decode_content(_encode(coding, BODY), coding) == (BODY, None)


def test_raw_deflate_and_identity_and_chains():
    c = zlib.compressobj(wbits=-15)
    raw = c.compress(BODY) + c.flush()
    assert decode_content(raw, "deflate") == (BODY, None)
    assert decode_content(BODY, "identity") == (BODY, None)
    assert decode_content(BODY, None) == (BODY, None)
    chained = brotli.compress(gzip.compress(BODY))  # applied gzip first, then br
    assert decode_content(chained, "gzip, br") == (BODY, None)


def test_concatenated_gzip_members():
    assert decode_content(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip") == (b"abcd", None)


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_truncated_body_keeps_what_was_decodable(coding):
    # A stream reset mid-way: flushed chunks must still decode.
    if coding == "gzip":
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        wire = c.compress(BODY[:1000]) + c.flush(zlib.Z_SYNC_FLUSH)
    elif coding == "br":
        c = brotli.Compressor()
        wire = c.process(BODY[:1000]) + c.flush()
    else:
        c = zstandard.ZstdCompressor().compressobj()  # type: ignore[assignment]  # c names each codec's object
        wire = c.compress(BODY[:1000]) + c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    data, err = decode_content(wire, coding)
    assert data == BODY[:1000]
    assert err is not None and coding in err


def test_unknown_coding_is_reported_not_raised():
    data, err = decode_content(b"abc", "snappy")
    assert data == b"abc" and "snappy" in (err or "")


def test_sse_fields_and_line_endings():
    text = 'event: a\r\ndata: one\r\ndata: two\r\n\r\n: comment\n\ndata:{"k":1}\n\nevent: tail\ndata: cut'
    assert list(iter_sse(text)) == [("a", "one\ntwo"), ("message", '{"k":1}'), ("tail", "cut")]


EVENTS = [("message_start", '{"a": 1}'), ("message", "[DONE]"), ("content_block_delta", '{"t": "x\\ny"}')]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30),
    st.sampled_from(["\n", "\r\n", "\r"]),
)
def test_sse_is_independent_of_chunking_and_newlines(cuts, nl):
    # The tee stores chunks as they came; joined, any split and any newline style parse the same.
    text = "".join((f"event: {e}{nl}" if e != "message" else "") + f"data: {d}{nl}{nl}" for e, d in EVENTS)
    pieces, pos = [], 0
    for cut in cuts:
        pieces.append(text[pos : pos + cut])
        pos += cut
    pieces.append(text[pos:])
    assert list(iter_sse("".join(pieces))) == EVENTS
