"""Stores as amb wrote them before packs: one loose zlib file (or chunk list) per blob."""

from __future__ import annotations

import os
import shutil
import zlib

from schemas import blobcodec, packstore
from schemas.blobstore import COMPRESSION_LEVEL, DECODE_LIMIT, BlobStore


def explode(blobs: BlobStore) -> int:
    """Turn every packed blob into the loose file an old store had for it, then drop the packs."""
    blobs.close()
    n = 0
    for pack in blobs.pack_files():
        for r in packstore.scan(pack):
            path = blobs.root / r.hexd[:2] / r.hexd[2:]
            if path.exists():
                continue
            if r.codec == blobcodec.CHUNKS:
                stored = bytes(r.stored)
            else:
                content = blobcodec.decode(r.codec, r.stored, DECODE_LIMIT, r.hexd)
                stored = zlib.compress(content, COMPRESSION_LEVEL)
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(stored)
            os.chmod(path, 0o444)
            n += 1
    shutil.rmtree(blobs.packs_dir)
    blobs.forget()
    return n
