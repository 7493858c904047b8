"""The spool file format, shared by the writer (recorder) and the reader (replay). A CONTRACT.

A spool is one append-only file per (run, source)::

    file   := MAGIC frame*
    frame  := u32le body_length  u32le crc32(body)  body        (body_length > 0)
    body   := the event's canonical body (see ``schemas.codec``)

The checksum catches a corrupted frame; the length prefix lets a reader find the end of a frame
without parsing JSON. A writer killed mid-frame (``kill -9``) leaves a *torn tail*: a last frame
whose header or body is incomplete, whose checksum does not match, or trailing zero bytes (a file
extended but never written). ``scan`` keeps every complete frame before it and reports the tail.
A bad frame that is followed by more data is corruption, not a torn tail, and is an error.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from schemas.errors import SpoolError

MAGIC = b"AMBSPL1\n"
HEADER = struct.Struct("<II")


def encode_frame(body: bytes) -> bytes:
    return HEADER.pack(len(body), zlib.crc32(body)) + body


class Tail(NamedTuple):
    """An incomplete last frame: where it starts and how many bytes it has."""

    offset: int
    length: int
    why: str


class Scan(NamedTuple):
    bodies: list[memoryview]
    """Every complete, checksummed frame body, in file order."""
    end: int
    """Offset just after the last good frame (where a resuming writer truncates to)."""
    tail: Tail | None
    """The torn tail, if any."""


def scan(data: bytes, name: str = "spool") -> Scan:
    """Split a spool's bytes into frame bodies; raise SpoolError on corruption before the end."""
    if not data.startswith(MAGIC):
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            return Scan([], 0, Tail(0, len(data), "incomplete file header") if data else None)
        raise SpoolError(f"{name}: not a spool file (bad magic)")
    view = memoryview(data)
    size = len(data)
    pos = len(MAGIC)
    bodies: list[memoryview] = []
    crc32 = zlib.crc32
    unpack = HEADER.unpack_from
    while pos < size:
        if size - pos < HEADER.size:
            return Scan(bodies, pos, Tail(pos, size - pos, "incomplete frame header"))
        length, crc = unpack(data, pos)
        start = pos + HEADER.size
        if length == 0:
            if not any(view[pos:]):
                return Scan(bodies, pos, Tail(pos, size - pos, "zero-filled tail"))
            raise SpoolError(f"{name}: corrupt frame at byte {pos} (zero length)")
        if start + length > size:
            return Scan(bodies, pos, Tail(pos, size - pos, "incomplete frame body"))
        body = view[start : start + length]
        if crc32(body) != crc:
            if start + length == size:
                return Scan(bodies, pos, Tail(pos, size - pos, "checksum mismatch in last frame"))
            raise SpoolError(f"{name}: corrupt frame at byte {pos} (checksum mismatch)")
        bodies.append(body)
        pos = start + length
    return Scan(bodies, pos, None)
