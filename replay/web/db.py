"""A read-only connection to the store that lets writers in.

DuckDB lets a process write the file only while no other process holds it open, even read-only, so
the viewer opens its connection on demand and closes it after a short idle spell (a writer retries
with backoff meanwhile: ``replay.store``). Each request works on its own cursor. A pass over the
whole store runs under a small memory limit, so that the viewer does not end holding the whole file
cached (``SharedReader.scan``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import duckdb

from replay.bounded import DatabaseMemory
from replay.store import DB_NAME, lock_sql, open_sql, sql_locked
from schemas.errors import AmbError

T = TypeVar("T")

SCAN_MEMORY = 4 << 20
"""The database's memory limit per core while the whole store is scanned: the scans aggregate into a
row per run, and every block they read is read once."""


class SharedReader:
    """Hands out read-only cursors; closes the underlying connection after ``idle_s`` unused."""

    def __init__(self, root: Path, idle_s: float = 2.0):
        self.root = root
        self.idle_s = idle_s
        self._lock = threading.Condition()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._scanning = False
        """A scan holds the connection, its configuration not locked yet: other cursors wait."""
        self._active = 0
        self._last_used = time.monotonic()
        self._closed = False
        self._reaper = threading.Thread(target=self._reap, name="amb-serve-reaper", daemon=True)
        self._reaper.start()

    def generation(self) -> tuple[int, int, int]:
        """Changes whenever a writer changed the store (file and WAL sizes and times)."""
        db = self.root / DB_NAME
        wal = db.with_name(DB_NAME + ".wal")
        st = db.stat()
        return st.st_mtime_ns, st.st_size, wal.stat().st_size if wal.exists() else 0

    def warm(self) -> None:
        """Open the connection in the background if it is closed: a page was just asked for, and its
        API calls follow shortly (the opening is then done while the browser parses the page)."""
        with self._lock:
            if self._con is not None or self._closed:
                return

        def open_now() -> None:
            try:
                with self.cursor():
                    pass
            except (AmbError, duckdb.Error, OSError):
                pass  # the request that follows opens it again and reports why it cannot

        threading.Thread(target=open_now, name="amb-serve-warm", daemon=True).start()

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._lock:
            self._lock.wait_for(lambda: not self._scanning)
            if self._con is None:
                self._con = open_sql(self.root)
            self._active += 1
            cur = self._con.cursor()
        try:
            yield cur
        finally:
            self._release(cur)

    def scan(self, step: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """``step`` (a pass over the whole store) on a cursor under ``SCAN_MEMORY`` per core, doubled
        while the database runs short, lifted once it is done. The limit is set on a connection
        opened for the pass, before its configuration is locked (an idle open one is closed first;
        one in use is scanned as it is)."""
        with self._lock:
            self._lock.wait_for(lambda: not self._scanning)
            if self._active == 0:
                self._drop()
            if self._con is None:
                self._con = open_sql(self.root, lock=False)
                # (locked already when another connection of this process holds the database)
                self._scanning = not sql_locked(self._con)
            scanning = self._scanning
            self._active += 1
            cur = self._con.cursor()
        try:
            if not scanning:
                return step(cur)
            try:
                with DatabaseMemory(cur, SCAN_MEMORY * (os.cpu_count() or 1)) as memory:
                    return memory.retrying(lambda: step(cur))
            finally:
                with self._lock:
                    try:
                        lock_sql(cur)
                    except duckdb.Error:  # (closed meanwhile) never handed out unlocked
                        self._drop()
                    self._scanning = False
                    self._lock.notify_all()
        finally:
            self._release(cur)

    def _release(self, cur: duckdb.DuckDBPyConnection) -> None:
        cur.close()
        with self._lock:
            self._active -= 1
            self._last_used = time.monotonic()

    def _reap(self) -> None:
        while not self._closed:
            time.sleep(min(self.idle_s, 0.5))
            with self._lock:
                idle = time.monotonic() - self._last_used
                if self._active == 0 and idle >= self.idle_s:
                    self._drop()

    def _drop(self) -> None:
        """Close the connection (the lock held)."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def close(self) -> None:
        self._closed = True
        with self._lock:
            if self._con is not None:
                try:
                    # A request still running (a long verify) is stopped, not waited for.
                    self._con.interrupt()
                    self._con.close()
                except duckdb.Error:
                    pass
                self._con = None
