"""The content-addressed blob store: one directory, shared by every run. A CONTRACT.

Layout: ``<root>/<hex[0:2]>/<hex[2:]>`` where ``hex`` is the sha256 of the *uncompressed* bytes;
each file is the zlib-compressed content (stdlib only, so the in-container shim and any reader can
use it). Blobs are write-once: a blob is written to a temporary file, fsync'd (when asked), then
hard-linked into place, which fails harmlessly if another writer got there first; a stored blob is
never rewritten. The same bytes from any number of runs are stored once.
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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{os.getpid()}-{id(data):x}-{path.name[:16]}"
        try:
            with open(tmp, "wb") as f:
                f.write(zlib.compress(data, COMPRESSION_LEVEL))
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o444)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        except OSError as e:
            raise BlobError(f"cannot write blob {blob}: {e}") from e
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        return ref

    def get(self, blob: str | BlobRef) -> bytes:
        """The blob's bytes, checked against its address."""
        address = blob.blob if isinstance(blob, BlobRef) else blob
        path = self.path_of(address)
        try:
            data = zlib.decompress(path.read_bytes())
        except FileNotFoundError:
            raise BlobError(f"blob {address} is missing from {self.root}") from None
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
