"""Every stored blob's content, read straight from the files (packs and loose), for tests that
search the store's bytes (no key may be anywhere): compressed records are searched decompressed."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

from schemas import blobcodec, packstore
from schemas.blobstore import CHUNK_MAGIC, DECODE_LIMIT, BlobStore


def blob_contents(blobs: Path) -> Iterator[tuple[str, bytes]]:
    """(where, content) of every record of every pack and every loose file under ``blobs``."""
    store = BlobStore(blobs)
    for pack in sorted(blobs.glob("packs/*" + packstore.PACK_SUFFIX)):
        for r in packstore.scan(pack):
            yield (
                f"{pack.name}:{r.offset}",
                store.get("sha256:" + r.hexd)  # a delta: searched as its whole content
                if r.codec == blobcodec.DELTA
                else blobcodec.decode(r.codec, r.stored, DECODE_LIMIT, r.hexd),
            )
    for path in sorted(blobs.glob("??/*")):
        data = path.read_bytes()
        yield str(path), data if data.startswith(CHUNK_MAGIC) else zlib.decompress(data)
