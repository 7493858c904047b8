"""Blob packs: where a recording producer appends blobs during a run. A CONTRACT.

A new file costs an inode (docs/recording.md), so the proxy creates none while the agent waits: it
appends each stored blob file's exact bytes to one pack per (run, source), next to its spool, and
the pack is *materialised* into the blob store (``schemas.packstore``, skipping what is stored
already) when the producer closes, or by ``amb ingest`` if it never closed (a crash).

Format::

    pack   := MAGIC record*
    record := HEX SP LENGTH LF STORED
    HEX    := the blob's address without its prefix (64 lowercase hex characters)
    LENGTH := len(STORED) in decimal
    STORED := the bytes of a loose blob file of that address (zlib-compressed content, or a
              chunk list whose chunks are earlier records or already stored)

A record is appended with one ``writev`` before any event that refers to it is appended to the
spool, and the pack is fsync'd before the spool at every group commit: an event that is durable
has durable blobs. A producer killed mid-record leaves a torn tail, which is ignored (no event can
refer to it) and reported. A pack is read only to materialise it; ``BlobStore.get`` re-hashes
what it returns and ``amb verify`` checks every referenced blob, so a damaged record is caught
there, as a damaged blob file would be.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from schemas.blobstore import BlobStore
from schemas.errors import SpoolError

MAGIC = b"AMBBLOBS 1\n"
SUFFIX = ".blobs"
"""A pack lives at ``spool/<run>/<source>.blobs``, beside ``<source>.spool``."""

_HEADER = re.compile(rb"([0-9a-f]{64}) (0|[1-9][0-9]{0,11})\n")


def record_header(hexd: str, stored_len: int) -> bytes:
    return b"%s %d\n" % (hexd.encode(), stored_len)


class Materialised(NamedTuple):
    records: int
    created: int
    torn_at: int | None
    """Byte offset of an incomplete last record, if any."""
    torn_bytes: int


def read_records(data: bytes, name: str) -> tuple[list[tuple[str, memoryview]], int | None]:
    """The complete records of a pack, and the offset of a torn tail (None if there is none)."""
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            return [], (0 if data else None)  # the header itself was cut short
        raise SpoolError(f"{name}: not a blob pack (bad magic)")
    view, pos = memoryview(data), len(MAGIC)
    out: list[tuple[str, memoryview]] = []
    while pos < len(data):
        m = _HEADER.match(data, pos, min(len(data), pos + 80))
        if m is None:
            end = data.find(b"\n", pos, pos + 80)
            if end == -1 and len(data) - pos < 80:
                return out, pos  # a header cut short
            raise SpoolError(f"{name}: byte {pos}: not a blob record header")
        start = m.end()
        stop = start + int(m.group(2))
        if stop > len(data):
            return out, pos  # a record cut short
        out.append((m.group(1).decode(), view[start:stop]))
        pos = stop
    return out, None


def materialise(pack: Path, store: BlobStore, *, sync: bool = True) -> Materialised:
    """Write every complete record of ``pack`` into ``store`` (existing blobs are left alone)."""
    data = pack.read_bytes()
    records, torn_at = read_records(data, str(pack))
    created = 0
    for hexd, stored in records:
        created += store.put_stored(hexd, stored, sync=False)
    if sync and created:
        store.flush()
    torn_bytes = len(data) - torn_at if torn_at is not None else 0
    return Materialised(len(records), created, torn_at, torn_bytes)


def packs_in(run_dir: Path) -> Iterator[Path]:
    """The packs in a run's folder (none if it has no folder), by name; as ``glob``, but a
    listing matched by suffix takes a third of the time (ingest asks of every run)."""
    try:
        names = os.listdir(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        return iter([])
    return iter(sorted(run_dir / n for n in names if n.endswith(SUFFIX) and not n.startswith(".")))


def pack_path(spool: os.PathLike[str] | str) -> Path:
    """The pack beside a spool file."""
    return Path(spool).with_suffix(SUFFIX)
