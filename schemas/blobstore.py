"""The content-addressed blob store: one directory, shared by every run. A CONTRACT.

Layout: ``<root>/<hex[0:2]>/<hex[2:]>`` where ``hex`` is the sha256 of the blob's *whole,
uncompressed* content: a blob's address never depends on how it is stored. A stored file is
either

- the zlib-compressed content (blobs up to ``CHUNK_ABOVE`` bytes), or
- a chunk list: ``CHUNK_MAGIC`` then one chunk address per line; each chunk is itself a blob.

Chunking is what makes dedup work for agent traffic: every model request resends the whole
conversation so far, so request *n* is request *n-1* plus a few messages. Chunk boundaries are
content-defined (at a message or line delimiter whose preceding bytes hash to a chosen residue,
between a minimum and a maximum size), hence the same for the same prefix: a growing conversation
stores each part once, and so do system prompts and briefs shared by many runs.

Blobs are write-once: written to a temporary file, fsync'd (when asked), then hard-linked into
place, which fails harmlessly if another writer got there first; a stored blob is never rewritten.
Reads re-hash what they return, so a corrupted or missing blob (or chunk) is always an error.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

from schemas.blob import DIGEST_RE, HASH_PREFIX, BlobRef
from schemas.errors import BlobError

COMPRESSION_LEVEL = 3
"""zlib level 3: most of level 9's ratio on JSON and text, at a fraction of the time."""

CHUNK_ABOVE = 32 * 1024
"""Blobs larger than this are stored as chunk lists."""
MIN_CHUNK = 8 * 1024
MAX_CHUNK = 256 * 1024
CHUNK_MAGIC = b"AMBCHUNKS 1\n"
_RESIDUES = 4
"""About one candidate in four (by a hash of the 32 bytes before it) is a boundary."""


def chunk_bounds(data: bytes) -> list[int]:
    """End offsets of the chunks of ``data`` (the last one is ``len(data)``).

    Candidates (a newline, or ``},{`` / ``}, {``) are found left to right without overlap with
    ``bytes.find``, which runs at memchr speed: a regex scan took ~18 ms on a 5 MB body while
    holding the GIL, stalling the proxy's event loop. A candidate becomes a cut when the chunk so
    far is at least MIN_CHUNK and the crc32 of the 32 bytes before it is 0 mod _RESIDUES; a chunk
    never exceeds MAX_CHUNK. tests/schemas/test_blobstore.py checks this against a regex
    formulation of the same rule.
    """
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
    """Start and end of the next ``},{`` or ``}, {`` at or after ``pos``; (-1, -1) if none.

    Jumps to the next ``}`` with a one-byte find (memchr, many GB/s) before looking for ``},``:
    a two-byte find crawls through a long brace-free run (a base64 image) at ~1 GB/s while holding
    the GIL, which on the proxy's event loop stalled every stream for ~4 ms per 5 MB body."""
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


class BlobStore:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def path_of(self, blob: str) -> Path:
        if not DIGEST_RE.match(blob):
            raise BlobError(f"not a blob address: {blob!r}")
        hexd = blob[len(HASH_PREFIX) :]
        return self.root / hexd[:2] / hexd[2:]

    def put(self, data: bytes, media_type: str = "application/octet-stream", *, sync: bool = True) -> BlobRef:
        """Store ``data`` once; return its reference. ``sync`` fsyncs before the blob is visible."""
        blob = HASH_PREFIX + hashlib.sha256(data).hexdigest()
        ref = BlobRef(blob=blob, size=len(data), media_type=media_type)
        path = self.path_of(blob)
        if path.exists():
            return ref
        if len(data) > CHUNK_ABOVE:
            chunks, start = [], 0
            for end in chunk_bounds(data):
                chunks.append(self._put_whole(data[start:end], sync))
                start = end
            self._write_once(path, CHUNK_MAGIC + "".join(c + "\n" for c in chunks).encode(), sync, blob)
        else:
            self._write_once(path, zlib.compress(data, COMPRESSION_LEVEL), sync, blob)
        return ref

    def _put_whole(self, data: bytes, sync: bool) -> str:
        """Store a chunk (never itself chunked); return its address."""
        blob = HASH_PREFIX + hashlib.sha256(data).hexdigest()
        path = self.path_of(blob)
        if not path.exists():
            self._write_once(path, zlib.compress(data, COMPRESSION_LEVEL), sync, blob)
        return blob

    def put_stored(self, hexd: str, stored: bytes | memoryview, *, sync: bool = True) -> bool:
        """Store an already encoded file under its address (a blob pack's record); True if new."""
        blob = HASH_PREFIX + hexd
        path = self.path_of(blob)
        if path.exists():
            return False
        return self._write_once(path, stored, sync, blob)

    def sync_dirs(self, shards: set[str]) -> None:
        """fsync shard directories, so that files linked into them survive a crash."""
        for shard in sorted(shards):
            try:
                fd = os.open(self.root / shard, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _write_once(self, path: Path, stored: bytes | memoryview, sync: bool, blob: str) -> bool:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{os.getpid()}-{os.urandom(4).hex()}-{path.name[:16]}"
        try:
            with open(tmp, "wb") as f:
                f.write(stored)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o444)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        except OSError as e:
            raise BlobError(f"cannot write blob {blob}: {e}") from e
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def get(self, blob: str | BlobRef) -> bytes:
        """The blob's bytes, checked against its address."""
        address = blob.blob if isinstance(blob, BlobRef) else blob
        path = self.path_of(address)
        try:
            stored = path.read_bytes()
        except FileNotFoundError:
            raise BlobError(f"blob {address} is missing from {self.root}") from None
        if stored.startswith(CHUNK_MAGIC):
            try:
                data = b"".join(self.get(line.decode()) for line in stored[len(CHUNK_MAGIC) :].splitlines())
            except BlobError as e:
                raise BlobError(f"blob {address} is corrupted (a chunk failed: {e})") from e
        else:
            try:
                data = zlib.decompress(stored)
            except zlib.error as e:
                raise BlobError(f"blob {address} is corrupted (cannot decompress: {e})") from e
        if HASH_PREFIX + hashlib.sha256(data).hexdigest() != address:
            raise BlobError(f"blob {address} is corrupted (content does not match its address)")
        return data

    def check(self, blob: str) -> str | None:
        """None if the blob is present and intact, else the reason."""
        try:
            self.get(blob)
        except BlobError as e:
            return str(e)
        return None

    def stored_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())
