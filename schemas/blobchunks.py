"""Content-defined chunking: where a large blob is cut into the chunks its chunk list names.

Chunking is what makes dedup work for agent traffic: every model request resends the whole
conversation so far, so request *n* is request *n-1* plus a few messages. Chunk boundaries are
content-defined (at a message or line delimiter whose preceding bytes hash to a chosen residue,
between a minimum and a maximum size), hence the same for the same prefix: a growing conversation
stores each part once, and so do system prompts and briefs shared by many runs. The blob store
(``schemas.blobstore``) and the proxy's blob writer cut with the same rule, so their addresses agree.
"""

from __future__ import annotations

import zlib

CHUNK_ABOVE = 32 * 1024
"""Blobs larger than this are stored as chunk lists."""
MIN_CHUNK = 8 * 1024
MAX_CHUNK = 256 * 1024
_RESIDUES = 4
"""About one candidate in four (by a hash of the 32 bytes before it) is a boundary."""


def chunk_bounds(data: bytes) -> list[int]:
    """End offsets of the chunks of ``data`` (the last one is ``len(data)``). Candidates (a newline,
    or ``},{`` / ``}, {``) are found left to right without overlap with ``bytes.find`` (memchr speed:
    a regex would stall the proxy's event loop). A candidate becomes a cut when the chunk so far is
    at least MIN_CHUNK and the crc32 of the 32 bytes before it is 0 mod _RESIDUES; a chunk never
    exceeds MAX_CHUNK."""
    bounds: list[int] = []
    last = 0
    crc32 = zlib.crc32
    find = data.find
    nl = find(b"\n")
    br_start, br_end = _next_brace(data, 0)
    while nl != -1 or br_start != -1:
        if br_start == -1 or (nl != -1 and nl < br_start):
            cut = nl + 1
            nl = find(b"\n", cut)
        else:
            cut = br_end
            br_start, br_end = _next_brace(data, cut)
        size = cut - last
        while size > MAX_CHUNK:
            last += MAX_CHUNK
            bounds.append(last)
            size = cut - last
        if size >= MIN_CHUNK and crc32(data[cut - 32 : cut]) % _RESIDUES == 0:
            bounds.append(cut)
            last = cut
    while len(data) - last > MAX_CHUNK:
        last += MAX_CHUNK
        bounds.append(last)
    if last < len(data):
        bounds.append(len(data))
    return bounds


def _next_brace(data: bytes, pos: int) -> tuple[int, int]:
    """Start and end of the next ``},{`` or ``}, {`` at or after ``pos``; (-1, -1) if none. Jumps to
    the next ``}`` first: a one-byte find runs at memchr speed through a long brace-free run (a
    base64 image), where a two-byte find crawls."""
    find = data.find
    while True:
        i = find(b"}", pos)
        if i == -1:
            return -1, -1
        i = find(b"},", i)
        if i == -1:
            return -1, -1
        if data[i + 2 : i + 3] == b"{":
            return i, i + 3
        if data[i + 2 : i + 4] == b" {":
            return i, i + 4
        pos = i + 1
