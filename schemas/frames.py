"""The spool file format, shared by the writer (recorder) and the reader (replay). A CONTRACT.

A spool is one append-only file per (run, source), one frame per line::

    file   := MAGIC frame*
    frame  := LENGTH TAB DIGEST TAB BODY LF
    LENGTH := the body's length in bytes, in decimal
    DIGEST := the lowercase hex sha256 of the body (64 characters), which is also the event's hash
    BODY   := the event's canonical body (see ``schemas.codec``); never contains TAB or LF, because
              canonical JSON escapes every control character inside strings

Each frame is length-prefixed and checksummed, and it is also a line of three tab-separated
fields: that lets ``amb ingest`` hand whole spools to DuckDB's CSV reader and check every length,
checksum and chain link in bulk, instead of one event at a time in Python.

A writer killed mid-frame (``kill -9``) leaves a *torn tail*: bytes after the last LF (a partial
frame, or zeros from a file extended but never written). ``scan`` keeps every complete frame
before it and reports the tail. A complete frame with a bad length or checksum is corruption,
not a torn tail, and is an error.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from schemas.errors import SpoolError

MAGIC = b"AMBSPOOL 2\n"
MAX_BODY = 4 * 1024 * 1024
"""Largest body a frame may hold; large content belongs in blobs, and the bulk reader is
configured for lines up to twice this."""

COMPRESSED_SUFFIX = ".zst"
"""``<source>.spool.zst``: the spool compressed (zstd) after its run was ingested (``replay.spools``)."""
DROPPED_SUFFIX = ".dropped"
"""``<source>.spool.dropped``: the empty marker a spool dropped after ingest leaves."""


def encode_frame(body: bytes, hexdigest: str) -> bytes:
    if b"\n" in body or b"\t" in body:
        raise SpoolError("event body contains a raw tab or newline (not canonical JSON)")
    if len(body) > MAX_BODY:
        raise SpoolError(
            f"event body of {len(body):,} bytes exceeds {MAX_BODY:,}; store large content as a blob"
        )
    return b"%d\t%s\t%s\n" % (len(body), hexdigest.encode(), body)


class Tail(NamedTuple):
    """Bytes after the last complete frame: where they start and how many there are."""

    offset: int
    length: int
    why: str


class Scan(NamedTuple):
    bodies: list[bytes]
    """Every complete, checksummed frame body, in file order."""
    end: int
    """Offset just after the last good frame (where a resuming writer truncates to)."""
    tail: Tail | None
    """The torn tail, if any."""


def complete_end(data: bytes) -> int:
    """Offset just after the last LF: everything from here on is a torn tail."""
    return data.rfind(b"\n") + 1


def tail_of(data: bytes) -> Tail | None:
    end = max(complete_end(data), len(MAGIC) if data.startswith(MAGIC) else 0)
    if end >= len(data):
        return None
    rest = data[end:]
    why = "zero-filled tail" if not rest.strip(b"\0") else "incomplete last frame"
    return Tail(end, len(rest), why)


def scan(data: bytes, name: str = "spool") -> Scan:
    """Split a spool's bytes into frame bodies, checking every length and checksum."""
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            return Scan([], 0, Tail(0, len(data), "incomplete file header") if data else None)
        raise SpoolError(f"{name}: not a spool file (bad magic)")
    tail = tail_of(data)
    end = tail.offset if tail else len(data)
    return Scan(frames(data, len(MAGIC), end, name), end, tail)


def frames(data: bytes, start: int, end: int, name: str, *, number: int = 0, at: int = 0) -> list[bytes]:
    """The bodies of the frames in ``data[start:end]`` (``end`` just after a LF), each checked; for the
    messages, ``number`` is the frame at ``start``'s number and ``at`` the file offset of ``data[0]``."""
    bodies: list[bytes] = []
    pos = start
    for line in data[start:end].split(b"\n")[:-1]:
        parts = line.split(b"\t", 2)
        problem = frame_problem(parts)
        if problem:
            raise SpoolError(f"{name}: corrupt frame {number + len(bodies)} at byte {at + pos} ({problem})")
        bodies.append(parts[2])
        pos += len(line) + 1
    return bodies


def frame_problem(parts: list[bytes]) -> str | None:
    """What is wrong with a frame (its line split at its first two TABs); None if it is sound."""
    if len(parts) != 3 or not parts[0].isdigit():
        return "not LENGTH TAB DIGEST TAB BODY"
    length, digest, body = parts
    if int(length) != len(body):
        return f"length {int(length)}, body has {len(body)}"
    if hashlib.sha256(body).hexdigest().encode() != digest:
        return "checksum mismatch"
    return None
