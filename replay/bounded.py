"""What a pass over a whole store holds, kept from growing with the store (``amb verify``): the
database's cache of the file, under a small memory limit, and the blob references the events make,
on disk."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from typing import TypeVar

import duckdb

from schemas.blob import HASH_PREFIX

T = TypeVar("T")

DATABASE_MEMORY = 64 << 20
"""The database's memory limit while a whole store's events are scanned (left alone, DuckDB keeps
every block it read cached: the scan would end holding the whole file). A chunk that needs more is
fetched again with twice the limit (``DatabaseMemory``), outside a transaction: running short
aborts the transaction it ran in."""


class DatabaseMemory:
    """The database's memory limit, lowered for a scan and reset to DuckDB's default after it (on the
    SQL sandbox, which cannot work the default out without a file system, set back to what it was)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, limit: int | None = None):
        self.con, self.limit = con, limit or DATABASE_MEMORY
        self.seen = _setting(con)
        self.default = _bytes(self.seen)

    def __enter__(self) -> DatabaseMemory:
        self._apply()
        return self

    def grow(self) -> bool:
        """Twice the limit (up to the default); False if it was the default already."""
        if self.limit >= self.default:
            return False
        self.limit *= 2
        self._apply()
        return True

    def retrying(self, step: Callable[[], T]) -> T:
        """``step``, run again with twice the limit while the database runs short of memory (a step
        that runs short must have kept nothing of what it did)."""
        while True:
            try:
                return step()
            except duckdb.OutOfMemoryException:
                if not self.grow():
                    raise

    def checkpoint(self) -> None:
        """What was written moved from the log into the file under this limit (left to the store's
        close, the checkpoint would hold the tables it rewrites under DuckDB's default limit)."""
        self.retrying(lambda: self.con.execute("CHECKPOINT"))

    def _apply(self) -> None:
        """The limit set: DuckDB refuses one below what it holds and cannot drop (a writer's
        tables in memory), and then the limit doubles until it takes."""
        while self.limit < self.default:
            try:
                self.con.execute(f"SET memory_limit = '{self.limit}B'")
                return
            except duckdb.OutOfMemoryException:
                self.limit *= 2
        self._reset()

    def _reset(self) -> None:
        try:
            self.con.execute("RESET memory_limit")
        except duckdb.PermissionException:
            self.con.execute(f"SET memory_limit = '{self.seen}'")

    def __exit__(self, *exc: object) -> None:
        try:
            self._reset()
        except duckdb.TransactionException:
            pass  # the caller's transaction was aborted (what aborted it is on its way up)


def drop_cache(con: duckdb.DuckDBPyConnection) -> None:
    """Let go of every block of the file the database holds cached and nothing uses (a pass over a
    store in parts, between two parts): the limit set to nothing and back."""
    with DatabaseMemory(con, 1 << 20):
        pass


_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_UNITS |= {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def memory_limit(con: duckdb.DuckDBPyConnection) -> int:
    """The database's memory limit in bytes."""
    return _bytes(_setting(con))


def _setting(con: duckdb.DuckDBPyConnection) -> str:
    """The database's memory limit as DuckDB words it (``18.8 GiB``), which it also reads back."""
    row = con.execute("SELECT current_setting('memory_limit')").fetchone()
    return str(row[0] if row else "0 bytes")


def _bytes(setting: str) -> int:
    number, unit = setting.split()
    return int(float(number) * _UNITS.get(unit, 1))


class References:
    """The blob addresses the events refer to, kept as 32-byte digests in an unlinked temporary file
    (so that the memory of ``amb verify`` does not grow with the store), iterated in the order they
    came. A blob two chunks refer to is kept twice (cheaper than remembering every address)."""

    READ = 32 << 16
    """Bytes read back at a time."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()

    def update(self, addresses: list[str]) -> None:
        if addresses:
            # (BLOB_REF_SQL: all sha256:HEX)
            self._file.write(bytes.fromhex("".join(a[len(HASH_PREFIX) :] for a in addresses)))

    def __iter__(self) -> Iterator[str]:
        """The addresses (read once all are in: no update meanwhile)."""
        for block in self.blocks():
            hexes = block.hex()
            yield from (HASH_PREFIX + hexes[i : i + 64] for i in range(0, len(hexes), 64))

    def blocks(self) -> Iterator[bytes]:
        """The addresses as their 32-byte digests, many at a time (read once all are in)."""
        self._file.seek(0)
        while block := self._file.read(self.READ):
            yield block
        self._file.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._file.close()
