"""Content decoding and SSE splitting: the parts every recorded stream goes through."""

from __future__ import annotations

import gzip
import json
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.providers import brotli_bounded
from schemas.providers.wire import (
    ContentTooLarge,
    array_elements,
    array_frames,
    decode_content,
    iter_sse,
    sse_frames,
)


def decode(raw: bytes, encoding: str | None) -> tuple[bytes, str | None]:
    return decode_content(raw, encoding, brotli)


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
    assert decode(_encode(coding, BODY), coding) == (BODY, None)


def test_raw_deflate_and_identity_and_chains():
    c = zlib.compressobj(wbits=-15)
    raw = c.compress(BODY) + c.flush()
    assert decode(raw, "deflate") == (BODY, None)
    assert decode(BODY, "identity") == (BODY, None)
    assert decode(BODY, None) == (BODY, None)
    chained = brotli.compress(gzip.compress(BODY))  # applied gzip first, then br
    assert decode(chained, "gzip, br") == (BODY, None)


def test_concatenated_gzip_members():
    assert decode(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip") == (b"abcd", None)


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
    data, err = decode(wire, coding)
    assert data == BODY[:1000]
    assert err is not None and coding in err


def test_unknown_coding_is_reported_not_raised():
    data, err = decode(b"abc", "snappy")
    assert data == b"abc" and "snappy" in (err or "")
    # brotli's module is the caller's to give: without it, br is a coding the caller cannot undo.
    assert decode_content(brotli.compress(BODY), "br") == (
        brotli.compress(BODY),
        "unknown content-encoding 'br'",
    )


def test_sse_fields_and_line_endings():
    text = 'event: a\r\ndata: one\r\ndata: two\r\n\r\n: comment\n\ndata:{"k":1}\n\nevent: tail\ndata: cut'
    assert list(iter_sse(text.encode())) == [("a", "one\ntwo"), ("message", '{"k":1}'), ("tail", "cut")]


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
    assert list(iter_sse("".join(pieces).encode())) == EVENTS


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["\n", "\r\n", "\r"]), st.booleans())
def test_sse_frames_cut_every_line_ending_alike_and_keep_the_bytes(nl, cut_off):
    # One framing for the proxy's parse and the replay's re-sending: an event ends at a blank line
    # whatever the line endings (a lone CR too), and the pieces are the stream's bytes unchanged.
    body = "".join((f"event: {e}{nl}" if e != "message" else "") + f"data: {d}{nl}{nl}" for e, d in EVENTS)
    if cut_off:
        body += 'data: {"cut'
    frames = sse_frames(body.encode())
    assert b"".join(frames) == body.encode()
    assert len(frames) == len(EVENTS) + cut_off
    assert list(iter_sse(body.encode())) == EVENTS[: len(frames)] + (
        [("message", '{"cut')] if cut_off else []
    )


def test_a_crlf_pair_split_across_frames_is_one_line_end():
    # "\r\n" is one line end: "a\r\n" then "\r\n" ends an event; "\r" alone before "\n" is not two.
    assert sse_frames(b"data: a\r\n\r\ndata: b\r\n") == [b"data: a\r\n\r\n", b"data: b\r\n"]
    assert sse_frames(b"data: a\r\ndata: b\r\n\r\n") == [b"data: a\r\ndata: b\r\n\r\n"]


def test_array_frames_cut_after_each_element_and_keep_the_bytes():
    elements = [{"a": 'x}{"y'}, {"b": [{"c": 1}]}, {"d": "\\"}]
    body = ("[" + ",\r\n".join(json.dumps(e) for e in elements) + "]").encode()
    frames = array_frames(body)
    assert b"".join(frames) == body and len(frames) == 3
    assert [json.loads(e) for e in array_elements(body)] == elements
    cut = body[: body.index(b'"c"')]  # inside the second element
    assert [json.loads(e) for e in array_elements(cut)] == elements[:1]
    assert b"".join(array_frames(cut)) == cut


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("br", brotli.compress),
        ("zstd", lambda b: zstandard.ZstdCompressor().compress(b)),
        (
            "zstd",
            lambda b: (
                zstandard.ZstdCompressor().compress(b[:100]) + zstandard.ZstdCompressor().compress(b[100:])
            ),
        ),
    ],
    ids=["gzip", "deflate", "br", "zstd", "zstd-frames"],
)
def test_a_limit_decodes_up_to_it_and_refuses_past_it(encoding, compress):
    raw = compress(BODY)
    assert decode_content(raw, encoding, brotli, limit=len(BODY)) == decode(raw, encoding) == (BODY, None)
    with pytest.raises(ContentTooLarge, match=f"more than {len(BODY) - 1:,} bytes"):
        decode_content(raw, encoding, brotli, limit=len(BODY) - 1)


def test_a_brotli_bomb_is_refused_holding_no_more_than_its_limit():
    """A few dozen bytes of brotli whose commands each copy 16 MiB: decoding stops at the limit, not
    at the end of the command that crosses it (which the brotli module's own decoder returns whole)."""
    import tracemalloc

    bomb = brotli.compress(bytes(48 << 20), quality=11, lgwin=24)
    limit = 2 << 20
    assert len(bomb) < 100
    tracemalloc.start()
    try:
        with pytest.raises(ContentTooLarge, match=f"more than {limit:,} bytes"):
            decode_content(bomb, "br", brotli, limit=limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit + 2 * brotli_bounded.ROOM + (1 << 20), peak
    assert decode_content(bomb, "br", brotli, limit=48 << 20) == (bytes(48 << 20), None)


@pytest.mark.parametrize("limit", [None, 1 << 20])
def test_a_corrupt_or_overlong_brotli_stream_is_an_error_not_an_exception(limit):
    data, err = decode_content(b"\xff" * 64, "br", brotli, limit=limit)
    assert data == b"" and err is not None and err.startswith("br body truncated or corrupt")
    data, err = decode_content(brotli.compress(BODY) + b"more", "br", brotli, limit=limit)
    assert data == b"" and err is not None and err.startswith("br body truncated or corrupt")


def test_brotli_decodes_to_its_limit_whichever_decoder_can_be_called(tmp_path):
    """A brotli module whose extension carries no decoder to call (here: a file that is no library):
    the system's decoder, or else the module's own in pieces, still decodes to the limit and no
    further."""
    import types

    (tmp_path / "not-a-library.so").write_bytes(b"not a shared object")
    stranger = types.SimpleNamespace(
        Decompressor=brotli.Decompressor,
        error=brotli.error,
        _brotli=types.SimpleNamespace(__file__=str(tmp_path / "not-a-library.so")),
    )
    raw = brotli.compress(BODY)
    assert decode_content(raw, "br", stranger, limit=len(BODY)) == (BODY, None)
    with pytest.raises(ContentTooLarge, match=f"more than {len(BODY) - 1:,} bytes"):
        decode_content(raw, "br", stranger, limit=len(BODY) - 1)
