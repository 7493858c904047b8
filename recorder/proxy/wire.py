"""Wire-level helpers: undo Content-Encoding and split Server-Sent Events.

Both run once per call on the complete (or cut-off) body, off the proxy's event loop: the stream
tee only keeps the raw chunks, so nothing here costs the live stream anything. The decoders accept
truncated input (a stream reset mid-way) and return what could be decoded plus an error note.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import brotli
import zstandard


def decode_content(raw: bytes, encoding: str | None) -> tuple[bytes, str | None]:
    """The body without its Content-Encoding (gzip, deflate, br, zstd, or a chain of them).

    Returns ``(decoded, error)``; on a truncated or corrupt body ``decoded`` holds everything that
    could be decoded and ``error`` says why it stopped.
    """
    if not encoding:
        return raw, None
    data = raw
    # Encodings are listed in the order they were applied; undo them in reverse.
    for coding in reversed([c.strip().lower() for c in encoding.split(",") if c.strip()]):
        if coding in ("identity", ""):
            continue
        try:
            data = _DECODERS[coding](data)
        except KeyError:
            return data, f"unknown content-encoding {coding!r}"
        except _Partial as p:
            return p.data, f"{coding} body truncated or corrupt: {p.why}"
    return data, None


class _Partial(Exception):
    def __init__(self, data: bytes, why: str):
        self.data, self.why = data, why


def _gzip(data: bytes) -> bytes:
    out = bytearray()
    rest = data
    while rest:  # concatenated gzip members are legal
        d = zlib.decompressobj(wbits=47)
        try:
            out += d.decompress(rest)
        except zlib.error as e:
            raise _Partial(bytes(out), str(e)) from None
        if not d.eof:
            raise _Partial(bytes(out), "incomplete gzip stream")
        rest = d.unused_data
    return bytes(out)


def _deflate(data: bytes) -> bytes:
    # "deflate" is zlib-wrapped by the spec, raw deflate in practice from some servers.
    for wbits in (15, -15):
        d = zlib.decompressobj(wbits=wbits)
        try:
            out = d.decompress(data)
        except zlib.error:
            continue
        if not d.eof:
            raise _Partial(out, "incomplete deflate stream")
        return out
    raise _Partial(b"", "not a deflate stream")


def _br(data: bytes) -> bytes:
    d = brotli.Decompressor()
    try:
        out = d.process(data)
    except brotli.error as e:
        raise _Partial(b"", str(e)) from None
    if not d.is_finished():
        raise _Partial(out, "incomplete brotli stream")
    return out


def _zstd(data: bytes) -> bytes:
    d = zstandard.ZstdDecompressor().decompressobj()
    try:
        out = d.decompress(data)
    except zstandard.ZstdError as e:
        raise _Partial(b"", str(e)) from None
    if not d.eof:
        raise _Partial(out, "incomplete zstd stream")
    return out


_DECODERS = {"gzip": _gzip, "x-gzip": _gzip, "deflate": _deflate, "br": _br, "zstd": _zstd}


def iter_sse(text: str) -> Iterator[tuple[str, str]]:
    """``(event, data)`` for every complete event in an SSE body.

    Follows the HTML spec's parsing: lines end in CRLF, LF or CR; ``data:`` lines of one event
    join with ``\\n``; one leading space after the colon is dropped; comments (``:``) are ignored;
    an event without ``event:`` is ``message``. An event cut off before its blank line (a reset
    stream) is still yielded, because its data may be complete.
    """
    event = ""
    data: list[str] = []
    has_data = False
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line:
            if has_data:
                yield event or "message", "\n".join(data)
            event, data, has_data = "", [], False
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
            has_data = True
        elif name == "event":
            event = value
    if has_data:
        yield event or "message", "\n".join(data)
