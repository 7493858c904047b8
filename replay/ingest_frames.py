"""The part of ``amb ingest``'s per-frame checks made in Python (hashlib's sha256 is much faster
than DuckDB's): every frame's length prefix and checksum, and each spool's count of blob
references. Each frame checked is copied, prefixed with its spool's index in the batch, to the few
files the bulk statement reads (``docs/storage.md``).

Both this reader and DuckDB's split lines at LF bytes after the header line; a line DuckDB split
otherwise (at a CR, say) fails the length check the statement keeps.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, NamedTuple

import duckdb

from replay.manifest import BLOB_MARK
from schemas.errors import SpoolError
from schemas.frames import frame_problem

CHUNK = 16 << 20
"""Bytes of a spool read at a time (a longer line is read whole)."""

_MARK = BLOB_MARK.encode()

FRAMES_PART = 4 << 20
"""Bytes of frames per file the bulk statement reads (``check_batch``): DuckDB pays a fixed cost per
file it opens, but holds more of one big file at once than of several."""


class Checked(NamedTuple):
    marks: int
    """Blob references in the spool's frames (``BLOB_MARK``: only a payload can hold one, since a
    loaded body's envelope strings hold no quote)."""
    problem: SpoolError | None
    """The spool's first frame whose length or checksum is wrong, worded as the statement words
    its own checks."""


def check_spool(
    key: str, path: str, chunk_bytes: int = CHUNK, out: BinaryIO | None = None, index: int = 0
) -> Checked:
    """The frames of one spool (``key`` is its name in the store) checked, and its references
    counted; with ``out``, each sound frame written there as ``INDEX TAB`` and the frame's line."""
    marks, number, rest = 0, 0, b""
    prefix = b"%d\t" % index
    with open(path, "rb") as src:
        src.readline()  # the header (DuckDB's skip = 1)
        while chunk := src.read(chunk_bytes):
            block = rest + chunk if rest else chunk
            end = block.rfind(b"\n") + 1
            rest, block = block[end:], block[:end]
            if not block:
                continue
            marks += block.count(_MARK)  # (no mark spans a LF)
            lines = block.split(b"\n")
            lines.pop()  # (after the last LF)
            if not _sound(lines):
                return Checked(marks, _first_problem(key, lines, number))
            if out is not None:
                out.write(prefix + (b"\n" + prefix).join(lines) + b"\n")
            number += len(lines)
    # Bytes after the last LF are no frame DuckDB loads: a spool read in place ends with a LF
    # (``ingest._prepare``), or it changed meanwhile and the batch is loaded again from copies.
    return Checked(marks, None)


class Frames(NamedTuple):
    """What the pass over a batch's spools found, and the files it wrote for the statement."""

    marks: dict[str, int]
    """Each spool's count of blob references."""
    problem: SpoolError | None
    """The first frame whose length or checksum is wrong."""
    parts: list[str]
    """The frames checked, each line prefixed with its spool's index in the batch."""


def check_batch(spools: list[tuple[str, str]], tmp: Path) -> Frames:
    """Each spool's (key, path to read) count of blob references (a new run's manifest count:
    ``replay.manifest``) and the first frame whose length or checksum is wrong; the frames checked
    are written to files in ``tmp`` of about ``FRAMES_PART`` bytes each."""
    frames = Frames({}, None, [])
    out = None
    try:
        for i, (key, path) in enumerate(spools):
            if out is None or out.tell() >= FRAMES_PART:
                if out is not None:
                    out.close()
                frames.parts.append(str(tmp / f"frames-{len(frames.parts)}"))
                out = open(frames.parts[-1], "wb")
            try:
                checked = check_spool(key, path, out=out, index=i)
            except OSError:
                continue  # removed meanwhile (``ingest._check_unchanged`` says so) or unreadable
            frames.marks[key] = checked.marks
            if checked.problem:
                return frames._replace(problem=checked.problem)
    finally:
        if out is not None:
            out.close()
    return frames


class FramesAhead:
    """Where each batch's frames files are written (``check_batch``, in ``tmp``); with a ``pool``, a
    batch's can be started ahead, while the database loads the one before it: the Python pass and
    the database's statement each keep a core busy."""

    def __init__(self, tmp: Path, pool: ThreadPoolExecutor | None):
        self.tmp, self.pool = tmp, pool
        self.written = 0
        self.ahead: dict[tuple[tuple[str, str], ...], Future[Frames]] = {}

    def start(self, spools: list[tuple[str, str]]) -> None:
        """These spools' (key, path to read) frames, written by the pool's thread from now."""
        if self.pool is not None and spools:
            self.ahead[tuple(spools)] = self.pool.submit(check_batch, spools, self._dir())

    def frames(self, spools: list[tuple[str, str]]) -> Frames:
        """These spools' frames: those started ahead for exactly them (once), else written now."""
        started = self.ahead.pop(tuple(spools), None)
        return started.result() if started else check_batch(spools, self._dir())

    @contextmanager
    def sharing(self, con: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """The database on one thread fewer while the pool's thread is still writing a batch ahead
        (else they take turns on the cores). Set on a cursor of its own: the setting is the
        database's, and the caller's transaction may be aborted when it is set back."""
        with con.cursor() as settings:
            threads = int(settings.execute("SELECT current_setting('threads')").fetchall()[0][0])
            if threads < 2 or all(f.done() for f in self.ahead.values()):
                yield
                return
            settings.execute(f"SET threads = {threads - 1}")
            try:
                yield
            finally:
                settings.execute(f"SET threads = {threads}")

    def _dir(self) -> Path:
        """A new folder for one batch's files (``ingest._prepare`` names copies by the entries of ``tmp``)."""
        self.written += 1
        folder = self.tmp / "frames" / str(self.written)
        folder.mkdir(parents=True)
        return folder


def _sound(lines: list[bytes]) -> bool:
    """Every line is LENGTH TAB DIGEST TAB BODY with the body's length and lowercase hex sha256:
    one comparison of two lists each for a sound block."""
    sha256 = hashlib.sha256
    try:
        parts = [line.split(b"\t", 2) for line in lines]
        return [sha256(p[2]).hexdigest() for p in parts] == [p[1].decode() for p in parts] and [
            len(p[2]) for p in parts
        ] == [int(p[0]) for p in parts]
    except (IndexError, ValueError):  # too few fields, a length or digest that is no number or text
        return False


def _first_problem(key: str, lines: list[bytes], number: int) -> SpoolError | None:
    """The first line of a block that ``_sound`` refused, worded like the statement's checks."""
    for i, line in enumerate(lines):
        parts = line.split(b"\t", 2)
        problem = frame_problem(parts)
        if problem and len(parts) == 3:
            return SpoolError(f"spool {key}: seq {_seq_of(parts[2])}: {problem}")
        if problem:
            return SpoolError(f"spool {key}: frame {number + i}: {problem}")
    return None


def _seq_of(body: bytes) -> str:
    """The seq a (possibly hostile) body claims, for the message; ``?`` if it claims none."""
    try:
        seq = json.loads(body).get("seq")
    except (ValueError, AttributeError):
        return "?"
    return str(seq) if isinstance(seq, int) and not isinstance(seq, bool) else "?"
