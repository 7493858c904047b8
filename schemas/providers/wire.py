"""The bytes of a model call on the wire: Content-Encoding, and how a stream is framed.

- **Content-Encoding** (gzip, deflate, zstd, br) is undone by the proxy on every recorded request
  and response, and by the replay endpoint on every request it matches. The replay endpoint, which
  any local agent can reach, decodes with a ``limit``: a compression bomb is refused, never decoded
  whole. brotli, the one package outside ``schemas``, is handed in by the caller (``brotli=``).
- **Server-Sent Events** (Chat Completions, Responses, Messages, Gemini's ``?alt=sse``) follow the
  HTML spec's framing; **Gemini's JSON-array stream** (no ``alt``) is one array whose elements are
  sent as they are made.

Everything here runs once per call on the whole (or cut-off) body, never on the live stream.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import zstandard

from schemas.providers import brotli_bounded
from schemas.untrusted_json import JSON_STRING

SSE_MEDIA = "text/event-stream"


class ContentTooLarge(ValueError):
    """The body decodes to more than the ``limit`` given to ``decode_content`` (a compression bomb)."""


def decode_content(
    raw: bytes, encoding: str | None, brotli: Any = None, limit: int | None = None
) -> tuple[bytes, str | None]:
    """``(decoded, error)``: the body without its Content-Encoding (gzip, deflate, br, zstd, or a
    chain of them) and None, or, for a truncated or corrupt body, all that could be decoded and why
    it stopped. ``brotli`` is the brotli module (``br``). With ``limit``, no step decodes to more
    than ``limit`` bytes: ``ContentTooLarge`` is raised once one would (a few kilobytes of gzip
    expand to gigabytes), before that much is held."""
    if not encoding:
        return raw, None
    data = raw
    # Encodings are listed in the order they were applied; undo them in reverse.
    for coding in reversed([c.strip().lower() for c in encoding.split(",") if c.strip()]):
        if coding in ("identity", ""):
            continue
        decoder = _DECODERS.get(coding)
        if decoder is None or (coding == "br" and brotli is None):
            return data, f"unknown content-encoding {coding!r}"
        try:
            data = decoder(data, brotli, limit)
        except _Partial as p:
            return p.data, f"{coding} body truncated or corrupt: {p.why}"
    return data, None


class _Partial(Exception):
    def __init__(self, data: bytes, why: str):
        self.data, self.why = data, why


def _too_large(out: bytes | bytearray, limit: int | None) -> None:
    if limit is not None and len(out) > limit:
        raise ContentTooLarge(f"the body decodes to more than {limit:,} bytes")


def _inflate(d: Any, data: bytes, limit: int | None, out: bytearray) -> None:
    """``data`` through zlib's ``d`` onto ``out``, never past ``limit`` (zlib stops there itself)."""
    if limit is None:
        out += d.decompress(data)
        return
    out += d.decompress(data, max(limit - len(out), 0) + 1)
    _too_large(out, limit)


def _fed(
    d: Any, process: Callable[[bytes], bytes], data: bytes, limit: int | None, ratio: int, out: bytearray
) -> int:
    """``data`` through a decoder ``d`` that cannot stop at an output size (zstd's, brotli's) onto
    ``out``, up to the end of its stream (``d.eof``, where the decoder has one), fed in pieces
    small enough that one cannot take ``out`` far past ``limit`` (``ratio``: the most bytes one
    byte of input decodes to). Returns how much of ``data`` was fed."""
    if limit is None:
        out += process(data)
        return len(data)
    pos = 0
    while pos < len(data) and not getattr(d, "eof", False):
        step = max(1, (limit - len(out)) // ratio)
        out += process(data[pos : pos + step])
        pos += step
        _too_large(out, limit)
    return pos


def _gzip(data: bytes, _: Any, limit: int | None) -> bytes:
    out = bytearray()
    rest = data
    while rest:  # concatenated gzip members are legal
        d = zlib.decompressobj(wbits=47)
        try:
            _inflate(d, rest, limit, out)
        except zlib.error as e:
            raise _Partial(bytes(out), str(e)) from None
        if not d.eof:
            raise _Partial(bytes(out), "incomplete gzip stream")
        rest = d.unused_data
    return bytes(out)


def _deflate(data: bytes, _: Any, limit: int | None) -> bytes:
    for wbits in (15, -15):  # zlib-wrapped, as the spec says; raw, as some servers send it
        d = zlib.decompressobj(wbits=wbits)
        out = bytearray()
        try:
            _inflate(d, data, limit, out)
        except zlib.error:
            continue
        if not d.eof:
            raise _Partial(bytes(out), "incomplete deflate stream")
        return bytes(out)
    raise _Partial(b"", "not a deflate stream")


BROTLI_RATIO = 1 << 22
"""Bytes one byte of brotli decodes to at most, over a piece of several (a meta-block of up to 16 MiB
whose commands take no bits still needs a header of several bytes): where no bounded decoder can be
called, the last piece fed may decode one meta-block past the limit, never more."""
ZSTD_RATIO = 1 << 15
"""Bytes one byte of zstd can decode to: an RLE block of 128 KiB takes 4."""


def _br(data: bytes, brotli: Any, limit: int | None) -> bytes:
    # The module's decoder has no output bound (one byte can decode to 16 MiB): with a limit, the
    # bounded one, else the module's in pieces.
    if limit is not None and brotli_bounded.available(brotli):
        out = bytearray()
        try:
            ended = brotli_bounded.decode(data, brotli, limit, out)
        except brotli_bounded.BrotliTooLarge as e:
            raise ContentTooLarge(str(e)) from None
        except brotli_bounded.BrotliError as e:
            raise _Partial(b"", str(e)) from None
        if not ended:
            raise _Partial(bytes(out), "incomplete brotli stream")
        return bytes(out)
    d = brotli.Decompressor()
    out = bytearray()
    try:
        _fed(d, d.process, data, limit, BROTLI_RATIO, out)
    except brotli.error as e:
        raise _Partial(b"", str(e)) from None
    if not d.is_finished():
        raise _Partial(bytes(out), "incomplete brotli stream")
    return bytes(out)


def _zstd(data: bytes, _: Any, limit: int | None) -> bytes:
    out = bytearray()
    rest = data
    while rest:  # concatenated frames are one body
        d = zstandard.ZstdDecompressor().decompressobj()
        try:
            fed = _fed(d, d.decompress, rest, limit, ZSTD_RATIO, out)
        except zstandard.ZstdError as e:
            raise _Partial(bytes(out), str(e)) from None
        if not d.eof:
            raise _Partial(bytes(out), "incomplete zstd stream")
        rest = d.unused_data + rest[fed:]  # what the decoder left of the last piece, then the rest
    return bytes(out)


_DECODERS = {"gzip": _gzip, "x-gzip": _gzip, "deflate": _deflate, "br": _br, "zstd": _zstd}


def _events(body: bytes, ends: bool = False) -> Iterator[tuple[int, list[bytes]]]:
    """Each event's lines, and where it ends in ``body`` when ``ends`` (-1 otherwise). Lines end in
    CRLF, LF or CR (``splitlines`` on bytes splits at exactly those); an empty line after a line of
    content ends an event, and a last event with no empty line (a reset stream) ends with the body."""
    end, lines = -1, []
    for line in body.splitlines(keepends=ends):
        if ends:
            end += len(line)
            line = line.rstrip(b"\r\n")
        if line:
            lines.append(line)
        elif lines:
            yield end + ends, lines
            lines = []
    if lines:
        yield len(body), lines


def sse_frames(body: bytes) -> list[bytes]:
    """The stream cut after each event's empty line. ``b"".join(sse_frames(body)) == body``."""
    out, start = [], 0
    for end, _ in _events(body, ends=True):
        out.append(body[start:end])
        start = end
    if start < len(body):
        out[-1:] = [out[-1] + body[start:]] if out else [body[start:]]
    return out


def sse_event(lines: list[bytes]) -> tuple[str, str] | None:
    """``(event, data)`` of one event's lines, None when it holds no ``data`` line.

    The HTML spec's reading: ``data:`` lines join with ``\n``; one space after the colon is
    dropped; comments (``:``) are ignored; an event without ``event:`` is ``message``."""
    event, data = b"", []
    for line in lines:
        name, sep, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value
    if not data:
        return None
    return event.decode("utf-8", "replace") or "message", b"\n".join(data).decode("utf-8", "replace")


def iter_sse(body: bytes) -> Iterator[tuple[str, str]]:
    """``(event, data)`` for every event of an SSE body, a cut-off last one included (its data may
    be complete)."""
    for _, lines in _events(body):
        event = sse_event(lines)
        if event is not None:
            yield event


def sse_body(events: list[dict[str, Any]], named: bool = False, end: bytes = b"\n\n") -> bytes:
    """Events as an SSE stream: a ``data:`` line each (after an ``event:`` line naming its
    ``type`` when ``named``), ending in ``end``."""
    return b"".join(
        (f"event: {e['type']}\n".encode() if named else b"") + b"data: " + json.dumps(e).encode() + end
        for e in events
    )


_ARRAY_TOKEN = re.compile(JSON_STRING.pattern + rb"|[{}]", re.DOTALL)
"""A JSON string (skipped whole, so braces inside it do not count) or a brace."""


def array_frames(body: bytes) -> list[bytes]:
    """A JSON-array stream cut after each top-level object (the array's ``]`` goes with the last
    piece). ``b"".join(array_frames(body)) == body``."""
    out: list[bytes] = []
    depth, start = 0, 0
    for m in _ARRAY_TOKEN.finditer(body):
        token = m.group()
        if token == b"{":
            depth += 1
        elif token == b"}":
            depth -= 1
            if depth == 0:
                out.append(body[start : m.end()])
                start = m.end()
    if start < len(body):
        if out and not body[start:].strip(b" \t\r\n,]"):
            out[-1] += body[start:]
        else:
            out.append(body[start:])
    return out


def array_elements(body: bytes) -> list[bytes]:
    """The top-level objects of a JSON-array stream that arrived whole (the stream may be cut off)."""
    elements = [frame.lstrip(b"[, \t\r\n").rstrip(b"] \t\r\n") for frame in array_frames(body)]
    return [e for e in elements if e.startswith(b"{") and e.endswith(b"}")]


def frames(body: bytes, media_type: str) -> list[bytes]:
    """A recorded stream cut into the pieces it was sent as: SSE events, else the JSON array's
    elements (Gemini), else the whole body."""
    if SSE_MEDIA in media_type:
        return sse_frames(body)
    if body.lstrip()[:1] == b"[":
        return array_frames(body)
    return [body] if body else []
