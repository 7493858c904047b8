"""Checking a shard (one run's spools and blobs, ``sweeps.shard``), or a run of another store,
before one byte of it is copied into a store (``replay.shards``).

A shard comes from a shared filesystem anything on the cluster could have written, so it is checked
whole: no symlinks or special files; only ``spool/<run>/<source>.spool``, ``blobs/``, ``shard.json``
and ``exec.json``; one run, the expected one (folder, ``shard.json``, spool folder and every
envelope agree); every file exactly the size ``shard.json`` lists (a truncated file is refused, not
loaded as a torn tail); every frame's length and checksum, and every blob against its address.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zstandard

from replay import spools
from schemas.blob import HASH_PREFIX
from schemas.blobpack import read_records
from schemas.blobstore import CHUNK_MAGIC, BlobStore
from schemas.codec import ID_RE, SOURCES
from schemas.errors import AmbError, BlobError, SpoolError
from schemas.frames import scan

SPOOL_RE = re.compile(r"^spool/([^/]+)/([A-Za-z0-9._:-]+)\.spool\Z")
PACK_RE = re.compile(r"^spool/([^/]+)/([A-Za-z0-9._:-]+)\.blobs\Z")
"""A blob pack a recorder that died left beside its spool: ingest moves its blobs into ``blobs/``."""
BLOB_RE = re.compile(r"^blobs/([0-9a-f]{2})/([0-9a-f]{62})\Z")
PACKFILE_RE = re.compile(r"^blobs/packs/[0-9a-f]{16}-[0-9]+-[0-9a-f]{6}\.(pack|idx)\Z")
"""The blob store's packs and their indexes (``schemas.packstore``): how a recorder stores blobs."""
WRITERS_LOCK_REL = "blobs/.writers.lock"
"""The blob writers' (empty) lock file: part of a store's layout, never copied."""
SHARD_META = ("shard.json", "exec.json")


class ShardError(AmbError):
    """A shard (or a source store's run) that is refused; the message names it and says why."""


class _Envelope(msgspec.Struct):
    run_id: str


class ShardSizes(msgspec.Struct):
    """``shard.json``: the run, and the size of each file of the shard."""

    run_id: str
    files: dict[str, int]


_envelope = msgspec.json.Decoder(_Envelope)


@dataclass
class Checked:
    """A shard that passed its checks: what to copy."""

    root: Path
    run_id: str
    spools: list[Path] = field(default_factory=list)
    packs: list[Path] = field(default_factory=list)
    data: dict[Path, bytes] = field(default_factory=dict)
    """Each spool's bytes as checked: what is copied is exactly what was checked."""
    blob_data: dict[str, bytes] = field(default_factory=dict)
    """Each loose blob's stored bytes as checked, by address."""
    records: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """Each packed blob's (codec, stored bytes) as checked, by address: copied record for record."""
    blobs: list[tuple[str, Path]] = field(default_factory=list)
    """(hex address, file) of every blob file."""


def walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``root`` (relative POSIX path, lstat), refusing symlinks and special files."""
    out: list[tuple[str, os.stat_result]] = []
    base = str(root)
    cut = len(base) + 1
    stack = [base]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                rel = entry.path[cut:]
                if stat.S_ISLNK(st.st_mode):
                    raise ShardError(f"{root}: {rel} is a symbolic link (a shard holds only its own files)")
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    out.append((rel, st))
                else:
                    raise ShardError(f"{root}: {rel} is not a regular file or folder")
    return out


def check_shard(root: Path, run_id: str, *, have_blob: Callable[[str], bool] | None = None) -> Checked:
    """Check one shard of ``run_id`` (see the module's docstring); raises ``ShardError``.

    ``have_blob(hex)``: blobs the target store already holds are neither checked again nor copied.
    """
    if not ID_RE.match(run_id):
        raise ShardError(f"{root}: {run_id!r} is not a run id")
    entries = _entries(root)
    sizes = _listed_sizes(root, run_id)
    checked = Checked(root, run_id)
    has_packs = _sort_entries(checked, entries)
    _check_sizes(root, sizes, {rel: st.st_size for rel, st in entries})
    if not checked.spools:
        raise ShardError(f"{root}: no spool of run {run_id!r}")
    for path in checked.spools:
        checked.data[path] = check_spool(root, path, run_id)
    if have_blob is not None:
        checked.blobs = [(hexd, path) for hexd, path in checked.blobs if not have_blob(hexd)]
    source_blobs = BlobStore(root / "blobs")
    for hexd, path in checked.blobs:
        checked.blob_data[hexd] = _verified_blob(root, source_blobs, hexd, path)
    if has_packs:
        _check_packed(root, source_blobs, checked, have_blob)
    return checked


def _entries(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every file of the shard folder ``root``, which must be a folder (not a link to one)."""
    try:
        st = os.lstat(root)
    except OSError as e:
        raise ShardError(f"{root}: cannot read: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ShardError(f"{root}: not a folder (a symbolic link or a file)")
    try:
        return walk(root)
    except OSError as e:
        raise ShardError(f"{root}: cannot read: {e.strerror or e}") from None


def _listed_sizes(root: Path, run_id: str) -> dict[str, int]:
    """The size of each file, as ``shard.json`` lists them (only files a shard may hold)."""
    try:
        meta = msgspec.json.decode((root / "shard.json").read_bytes(), type=ShardSizes)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ShardError(f"{root}: no readable shard.json ({e})") from None
    if meta.run_id != run_id:
        raise ShardError(f"{root}: shard.json claims run {meta.run_id!r}, the shard is run {run_id!r}")
    for rel in meta.files:
        if not (_store_file(rel) or rel in SHARD_META):
            raise ShardError(f"{root}: shard.json lists {rel!r}, which is not a shard's file")
    return meta.files


def _sort_entries(checked: Checked, entries: list[tuple[str, os.stat_result]]) -> bool:
    """Each file into the spools, blob packs left by a recorder, or blob files of ``checked``; any
    other file refuses the shard. True if the blob store's packs are among them."""
    root, run_id = checked.root, checked.run_id
    has_packs = False
    for rel, _st in entries:
        m = SPOOL_RE.match(rel)
        if m:
            if m.group(1) != run_id:
                raise ShardError(f"{root}: holds spools of run {m.group(1)!r}, the shard is run {run_id!r}")
            if m.group(2) not in SOURCES:
                raise ShardError(f"{root}: {rel}: unknown source {m.group(2)!r}")
            checked.spools.append(root / rel)
            continue
        p = PACK_RE.match(rel)
        if p:
            if p.group(1) != run_id:
                raise ShardError(
                    f"{root}: holds a blob pack of run {p.group(1)!r}, the shard is run {run_id!r}"
                )
            checked.packs.append(root / rel)
            continue
        b = BLOB_RE.match(rel)
        if b:
            checked.blobs.append((b.group(1) + b.group(2), root / rel))
            continue
        if rel in SHARD_META or rel == WRITERS_LOCK_REL:
            continue
        if PACKFILE_RE.match(rel):
            has_packs = True
            continue
        raise ShardError(
            f"{root}: {rel} is not part of a shard (spool/<run>/<source>.spool, blobs/, shard.json)"
        )
    return has_packs


def _check_sizes(root: Path, sizes: dict[str, int], present: dict[str, int]) -> None:
    """Every file exactly as ``shard.json`` lists it, and no file it does not list."""
    for rel, size in sizes.items():
        if rel not in present:
            raise ShardError(f"{root}: {rel} is missing (shard.json lists it)")
        if present[rel] != size:
            raise ShardError(
                f"{root}: {rel} is {present[rel]} bytes, shard.json says {size}: "
                + ("truncated" if present[rel] < size else "it grew after the run")
            )
    extra = sorted(set(present) - set(sizes) - set(SHARD_META))
    if extra:
        raise ShardError(f"{root}: {extra[0]} is not listed in shard.json")


def _store_file(rel: str) -> bool:
    return (
        bool(SPOOL_RE.match(rel) or PACK_RE.match(rel) or BLOB_RE.match(rel) or PACKFILE_RE.match(rel))
        or rel == WRITERS_LOCK_REL
    )


def _check_packed(
    root: Path, source: BlobStore, checked: Checked, have_blob: Callable[[str], bool] | None
) -> None:
    """Every blob the source's packs index (those the target lacks): checked whole against its
    address (a chunk list with all its chunks), then kept as its stored record. The index is read
    with every range checked against its pack, so a lying index fails here, naming the blob."""
    try:
        addresses = source.addresses()
    except (BlobError, OSError) as e:
        raise ShardError(f"{root}: blobs/packs: cannot read the index: {e}") from None
    for hexd in addresses:
        if have_blob is not None and have_blob(hexd):
            continue
        reason = source.check(HASH_PREFIX + hexd)
        if reason is not None:
            raise ShardError(f"{root}: {reason}")
        try:
            codec, stored = source.stored_record(hexd)
        except BlobError as e:
            raise ShardError(f"{root}: {e}") from None
        checked.records[hexd] = (codec, bytes(stored))


def _verified_blob(root: Path, source: BlobStore, hexd: str, path: Path) -> bytes:
    """A blob file's bytes, once its content was checked against its address. The common case (one
    zlib stream) is checked on the bytes read; anything else by the blob store's own reader."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ShardError(f"{root}: blobs/{hexd[:2]}/{hexd[2:]}: cannot read: {e.strerror or e}") from None
    if not raw.startswith(CHUNK_MAGIC):
        with contextlib.suppress(zlib.error):
            if hashlib.sha256(zlib.decompress(raw)).hexdigest() == hexd:
                return raw
    reason = source.check(HASH_PREFIX + hexd)
    if reason is not None:
        raise ShardError(f"{root}: {reason}")
    return raw


def check_spool(root: Path, path: Path, run_id: str) -> bytes:
    """A spool's bytes, checked: whole frames, every event of this run. ``path`` may name a spool
    another store compressed after ingest (``<source>.spool`` then reads ``<source>.spool.zst``)."""
    rel = path.relative_to(root).as_posix()
    try:
        data = path.read_bytes() if path.exists() else spools.read_bytes(spools.compressed_path(path))
        result = scan(data, rel)
    except SpoolError as e:
        raise ShardError(f"{root}: {e}") from None
    except OSError as e:
        raise ShardError(f"{root}: {rel}: cannot read: {e.strerror or e}") from None
    except zstandard.ZstdError as e:
        raise ShardError(f"{root}: {rel}{spools.COMPRESSED}: cannot decompress: {e}") from None
    if result.tail is not None:
        raise ShardError(f"{root}: {rel} is truncated ({result.tail.why} at byte {result.tail.offset})")
    for body in result.bodies:
        try:
            claimed = _envelope.decode(body).run_id
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ShardError(f"{root}: {rel}: an event without a readable envelope") from None
        if claimed != run_id:
            raise ShardError(f"{root}: {rel}: an event of run {claimed!r} in the shard of run {run_id!r}")
    return data


def _no_folders(run_dir: Path) -> None:
    """A run folder holds files only: a folder in it (one named like a spool or a blob pack, or an
    empty one, which a walk of its files would pass over) is refused, naming it."""
    try:
        with os.scandir(run_dir) as it:
            inner = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except OSError as e:
        raise ShardError(f"{run_dir}: cannot read: {e.strerror or e}") from None
    if inner:
        raise ShardError(f"{run_dir}: {inner[0]} is a folder, not a spool or a blob pack")


def check_pack(root: Path, path: Path) -> bytes:
    """A blob pack's bytes (``schemas.blobpack``), checked: whole records only. A pack cut short is
    refused as a truncated spool is; its records are checked against their addresses when loaded."""
    rel = path.relative_to(root).as_posix()
    try:
        data = path.read_bytes()
        _records, torn = read_records(data, rel)
    except SpoolError as e:
        raise ShardError(f"{root}: {e}") from None
    except OSError as e:
        raise ShardError(f"{root}: {rel}: cannot read: {e.strerror or e}") from None
    if torn is not None:
        raise ShardError(f"{root}: {rel} is truncated (a blob record cut short at byte {torn})")
    return data


def check_store_run(source: Path, run_id: str, *, with_blobs: bool = True) -> Checked:
    """One run of another store: its spool folder, and (once) the store's whole blob folder."""
    if not ID_RE.match(run_id):
        raise ShardError(f"{source}/spool/{run_id}: not a run id")
    checked = Checked(source, run_id)
    run_dir = source / "spool" / run_id
    entries = _entries(run_dir)
    _no_folders(run_dir)
    for rel, _st in entries:
        if rel.endswith((".spool", ".spool" + spools.COMPRESSED)) and "/" not in rel:
            plain = run_dir / rel.removesuffix(spools.COMPRESSED)
            if plain not in checked.spools:  # (a crash between compressing and removing leaves both)
                checked.spools.append(plain)
        elif rel.endswith(".spool" + spools.DROPPED) and "/" not in rel:
            raise ShardError(
                f"{run_dir}: {rel}: this store dropped the spool after ingest, so the run cannot be "
                "merged from it (its spools are needed; ingest with --spools compress or keep)"
            )
        elif PACK_RE.match(f"spool/{run_id}/{rel}"):
            checked.packs.append(run_dir / rel)
        else:
            raise ShardError(f"{run_dir}: {rel} is not a spool")
    if not checked.spools:
        raise ShardError(f"{run_dir}: holds no spool of the run")
    for path in checked.spools:
        checked.data[path] = check_spool(source, path, run_id)
    for path in checked.packs:
        checked.data[path] = check_pack(source, path)
    blobs_root = source / "blobs"
    if with_blobs and blobs_root.is_dir() and not blobs_root.is_symlink():
        store = BlobStore(blobs_root)
        for rel, _st in _entries(blobs_root):
            b = BLOB_RE.match("blobs/" + rel)
            if not b:
                continue  # a writer's temporary file
            hexd = b.group(1) + b.group(2)
            reason = store.check("sha256:" + hexd)
            if reason is not None:
                raise ShardError(f"{source}: {reason}")
            checked.blobs.append((hexd, blobs_root / rel))
        _check_packed(source, store, checked, None)
    return checked
