"""How a blob's bytes are stored in a pack: the codec byte of each record. A CONTRACT.

Codecs (one ASCII byte, written in the record's header and in the pack index):

- ``z``: zlib (what loose blob files and the recorder's own run packs hold);
- ``s``: zstd, one frame with its content size (the ``zstandard`` package);
- ``r``: raw, for content that is already compressed (PNG, JPEG, gzip-NIfTI, zip, ...);
- ``c``: a chunk list (``CHUNK_MAGIC`` then one chunk address per line), stored raw;
- ``d``: a delta: ``DELTA_MAGIC``, the 32-byte sha256 digest of a *base* blob, then one zstd
  frame (with its content size) compressed with the base's content as a raw-content dictionary.

A model request resends every message so far, so request *n* stored as a delta against request
*n-1* costs about the new messages alone. The figures behind these choices are in
docs/blob-packs.md.
"""

from __future__ import annotations

import threading
import zlib

import zstandard

from schemas.errors import BlobError

ZLIB = ord("z")
ZSTD = ord("s")
RAW = ord("r")
CHUNKS = ord("c")
DELTA = ord("d")
CODECS = frozenset({ZLIB, ZSTD, RAW, CHUNKS, DELTA})

DELTA_MAGIC = b"AMBD1"
"""Never the start of a zlib stream (its first byte is 0x78 here) nor of a chunk list, so a run pack's
record (which has no codec byte) is told apart by it."""
DELTA_HEAD = len(DELTA_MAGIC) + 32
"""Bytes before a delta's zstd frame: the magic and the base's binary digest."""

ZSTD_LEVEL = 3
INCOMPRESSIBLE_RATIO = 0.9
"""Samples that keep more than 90% of their size mark the blob as already compressed."""
SAMPLE = 4096
SAMPLE_ABOVE = 3 * SAMPLE
"""Smaller blobs are compressed whole (the check would cost as much as the compression)."""

MEDIA_MAGIC = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",  # JPEG
    b"\x1f\x8b",  # gzip (.nii.gz, .tar.gz)
    b"PK\x03\x04",  # zip, docx, npz
    b"\x28\xb5\x2f\xfd",  # zstd
    b"GIF8",
    b"BZh",
    b"\xfd7zXZ\x00",
    b"7z\xbc\xaf\x27\x1c",
)
"""Formats that are compressed by construction (WebP and MP4 are caught by the samples)."""

_local = threading.local()
"""One zstd compressor and decompressor per thread: neither may be used by two threads at once (a
shared decompressor fails now and then on a sound blob)."""


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    pair: tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor] | None = getattr(_local, "pair", None)
    if pair is None:
        pair = (
            zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True),
            zstandard.ZstdDecompressor(),
        )
        _local.pair = pair
    return pair


def looks_compressed(data: bytes | memoryview) -> bool:
    """True if ``data`` is a known compressed format or its samples do not compress."""
    head = bytes(data[:8])
    if any(head.startswith(m) for m in MEDIA_MAGIC):
        return True
    if len(data) < SAMPLE_ABOVE:
        return False
    mid = len(data) // 2 - SAMPLE // 2
    sample = bytes(data[:SAMPLE]) + bytes(data[mid : mid + SAMPLE]) + bytes(data[-SAMPLE:])
    return len(zlib.compress(sample, 1)) > INCOMPRESSIBLE_RATIO * len(sample)


def encode(data: bytes | memoryview) -> tuple[int, bytes]:
    """The codec and stored bytes for a blob's content (never a chunk list)."""
    if looks_compressed(data):
        return RAW, bytes(data)
    stored = _zstd()[0].compress(data)
    if len(stored) >= len(data):  # small and incompressible (not sampled): kept as it is
        return RAW, bytes(data)
    return ZSTD, stored


def encode_delta(data: bytes | memoryview, base_hex: str, base: bytes) -> bytes | None:
    """The stored bytes of ``data`` as a delta against ``base`` (content of blob ``base_hex``), or
    None when that is no smaller than ``encode`` would store it."""
    if looks_compressed(data):
        return None
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    frame = zstandard.ZstdCompressor(
        level=ZSTD_LEVEL, dict_data=dictionary, write_content_size=True
    ).compress(data)
    # A frame this small beats whole-body compression (0.1-0.3 of JSON) without trying it.
    if len(frame) * 16 > len(data) and DELTA_HEAD + len(frame) >= len(encode(data)[1]):
        return None
    return DELTA_MAGIC + bytes.fromhex(base_hex) + frame


def delta_base(stored: bytes | memoryview, address: str) -> str:
    """The hex address of a delta's base (the record's form checked)."""
    head = bytes(stored[:DELTA_HEAD])
    if not head.startswith(DELTA_MAGIC) or len(head) != DELTA_HEAD:
        raise BlobError(f"blob {address} is corrupted (a delta without its header)")
    return head[len(DELTA_MAGIC) :].hex()


def decode_delta(stored: bytes | memoryview, base: bytes, limit: int, address: str) -> bytes:
    """The content of a delta record, given its base's content (``delta_base`` names it)."""
    frame = bytes(stored[DELTA_HEAD:])
    try:
        size = zstandard.frame_content_size(frame)
        if size < 0 or size > limit:
            raise BlobError(f"blob {address} is corrupted (its delta frame claims {size} bytes)")
        fast = _apply_delta(frame, base)
        if fast is not None and len(fast) == size:
            return fast
        dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        out = zstandard.ZstdDecompressor(dict_data=dictionary).decompress(frame, max_output_size=size)
    except zstandard.ZstdError as e:
        raise BlobError(f"blob {address} is corrupted (cannot apply its delta: {e})") from e
    if len(out) != size:
        raise BlobError(f"blob {address} is corrupted (its delta is not the size it claims)")
    return out


ZSTD_DICT_MAGIC = b"\x37\xa4\x30\xec"
"""How a formatted zstd dictionary starts: zstd's own ``usingDict`` would load such a base as one."""

_RAW_BLOCK = 128 * 1024
"""The largest block of a zstd frame."""


def _raw_frame(data: bytes) -> bytes:
    """``data`` as a zstd frame of raw (stored) blocks: single segment, its content size stated."""
    parts: list[bytes | memoryview] = [b"\x28\xb5\x2f\xfd\xe0", len(data).to_bytes(8, "little")]
    view, pos = memoryview(data), 0  # (blocks as views: the base is copied once, by the join)
    while True:
        size = min(_RAW_BLOCK, len(data) - pos)
        last = pos + size >= len(data)
        parts += [(size << 3 | last).to_bytes(3, "little"), view[pos : pos + size]]
        pos += size
        if last:
            return b"".join(parts)


def _apply_delta(frame: bytes, base: bytes) -> bytes | None:
    """A delta's frame applied to its base with this thread's one decompressor, or None.

    A new zstd context per delta costs ten times the decompression itself; zstd's content-dictionary
    chain on the reused one does the same once the base is a frame of its own (of stored blocks). A
    base that starts like a formatted dictionary, or any error, is left to the plain path."""
    if not base or base.startswith(ZSTD_DICT_MAGIC):
        return None
    try:
        out: bytes = _zstd()[1].decompress_content_dict_chain([_raw_frame(base), frame])
    except zstandard.ZstdError:
        return None
    return out


def decode(codec: int, stored: bytes | memoryview, limit: int, address: str) -> bytes:
    """The content of a stored record; ``limit`` bounds what a hostile record may expand to."""
    try:
        if codec == RAW or codec == CHUNKS:
            return bytes(stored)
        if codec == DELTA:
            raise BlobError(f"blob {address}: a delta is read with its base (decode_delta)")
        if codec == ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(stored, limit + 1)
            if len(out) > limit or not d.eof:
                raise BlobError(f"blob {address} is corrupted (its zlib stream is cut or expands too far)")
            return out
        if codec == ZSTD:
            # The frame states its size; a lying size larger than any blob is refused unread.
            size = zstandard.frame_content_size(stored)
            if size < 0 or size > limit:
                raise BlobError(f"blob {address} is corrupted (its zstd frame claims {size} bytes)")
            out = _zstd()[1].decompress(stored)
            if len(out) != size:
                raise BlobError(f"blob {address} is corrupted (its zstd frame is not the size it claims)")
            return out
    except (zlib.error, zstandard.ZstdError) as e:
        raise BlobError(f"blob {address} is corrupted (cannot decompress: {e})") from e
    raise BlobError(f"blob {address} is corrupted (unknown codec byte {codec!r})")
