"""The store: one DuckDB file plus the blob directory and the spools, under one directory.

Layout of ``--store DIR`` (env ``AMB_STORE``, default ``./amb-store``)::

    DIR/amb.duckdb            events, views, score tables (single writer: amb ingest / amb score)
    DIR/blobs/ab/cdef...      content-addressed blobs (schemas.blobstore)
    DIR/spool/<run>/<src>.spool   append-only spools written by producers

DuckDB allows one writing process at a time, so a writer that finds the file locked (another
``amb-record`` ingesting) retries with backoff for ``lock_timeout_s`` before giving up.
Read-only connections for user SQL are locked down (see ``open_sql``).
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb

from replay import migrations as mig
from schemas.blobstore import BlobStore
from schemas.codec import ID_RE
from schemas.errors import NotFound, StoreError
from schemas.frames import COMPRESSED_SUFFIX

DEFAULT_STORE = "amb-store"
DB_NAME = "amb.duckdb"


def resolve(store: str | os.PathLike[str] | None) -> Path:
    """The store directory: the argument, else $AMB_STORE, else ./amb-store."""
    return Path(store or os.environ.get("AMB_STORE") or DEFAULT_STORE)


def waiting_runs(root: Path, held: Iterable[str] = ()) -> list[str]:
    """Runs with a spool in the store's directory that are not among ``held`` (the database's): recorded,
    not ingested yet (``amb-record --no-ingest``, an ingest that failed)."""
    held = set(held)
    try:
        return sorted(
            d.name
            for d in os.scandir(root / "spool")
            if d.name not in held
            and ID_RE.match(d.name)
            and d.is_dir(follow_symlinks=False)
            and any(n.endswith((".spool", ".spool" + COMPRESSED_SUFFIX)) for n in os.listdir(d.path))
        )
    except OSError:  # no spool directory (or one this user cannot read): nothing known to wait
        return []


def _require(root: Path) -> Path:
    """The database of an existing store; reading a store that does not exist is an error, so that
    a mistyped ``--store`` is not answered with an empty (and silently created) store."""
    db = root / DB_NAME
    if not db.exists():
        waiting = waiting_runs(root)
        if waiting:
            raise NotFound(
                f"no database at {root} yet: {len(waiting)} recorded run(s) wait in {root / 'spool'}; "
                "run `amb ingest`"
            )
        raise NotFound(
            f"no store at {root}: nothing was recorded or ingested there (check --store or AMB_STORE)"
        )
    return db


DAMAGE_SIGNS = (
    "Could not read enough bytes",  # cut short
    "not a valid DuckDB database file",  # a header that is not DuckDB's
    "Corrupt database file",  # a block whose checksum fails
)


_CORE_TABLE_MISSING = re.compile(r"Table with name (events|spool_files|manifests) does not exist")
"""A table every store has since its first migration, missing: a database file damaged or made
by hand, never a store amb wrote."""


def damage(e: BaseException, db: Path | None = None) -> StoreError | None:
    """The error to give when ``e`` says the database file is damaged (else None): what to do about
    it. The events are rebuilt from the spools by ``amb ingest`` into a new file; what only the
    database held (score rows, judge answers, the events of spools dropped after ingest) is not."""
    if not isinstance(e, duckdb.Error) or not any(sign in str(e) for sign in DAMAGE_SIGNS):
        if not (isinstance(e, duckdb.CatalogException) and _CORE_TABLE_MISSING.search(str(e))):
            return None
    where = str(db) if db is not None else f"the store's {DB_NAME}"
    dropped = len(list(db.parent.glob("spool/*/*.spool.dropped"))) if db is not None else 0
    lost = (
        f"; {dropped} spools were dropped after ingest and their events are lost with it" if dropped else ""
    )
    return StoreError(
        f"{where} is damaged ({str(e).splitlines()[0]}): move it aside and run `amb ingest`, which "
        f"rebuilds it from the spools (then `amb score` again: scores live in the database only){lost}"
    )


def _connect(
    path: Path, *, read_only: bool, config: dict[str, Any] | None, lock_timeout_s: float
) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + lock_timeout_s
    delay = 0.05
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only, config=config or {})
        except duckdb.IOException as e:
            text = str(e)
            locked = "lock" in text.lower() and ("Conflicting" in text or "Could not set lock" in text)
            if not locked or time.monotonic() > deadline:
                raise damage(e, path) or StoreError(f"cannot open {path}: {e}") from e
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)
        except duckdb.Error as e:
            raise damage(e, path) or StoreError(f"cannot open {path}: {e}") from e


class Store:
    """An open store. Use as a context manager; ``con`` is the DuckDB connection."""

    def __init__(self, root: Path, con: duckdb.DuckDBPyConnection, read_only: bool):
        self.root = root
        self.con = con
        self.read_only = read_only
        self.blobs = BlobStore(root / "blobs")

    @property
    def spool_dir(self) -> Path:
        return self.root / "spool"

    @classmethod
    def open(
        cls,
        store: str | os.PathLike[str] | None = None,
        *,
        read_only: bool = False,
        extra_migrations: list[mig.Migration] | None = None,
        lock_timeout_s: float = 120.0,
        create: bool = True,
    ) -> Store:
        """``create=False``: a writer of a store that must already exist (``amb score``), which a
        mistyped path must not create."""
        root = resolve(store)
        db = root / DB_NAME
        if read_only or not create:
            _require(root)
        if read_only:
            return cls(root, _connect(db, read_only=True, config=None, lock_timeout_s=lock_timeout_s), True)
        root.mkdir(parents=True, exist_ok=True)
        # Writers open (and create, and migrate) one at a time: without this, a second process
        # can open the file while the first is still writing its header, and read it as corrupt.
        with open(root / ".open.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            con = _connect(db, read_only=False, config=None, lock_timeout_s=lock_timeout_s)
            try:
                mig.apply(con, mig.CORE + list(extra_migrations or []))
            except duckdb.Error as e:
                con.close()
                raise StoreError(f"cannot migrate {db}: {e}") from e
        return cls(root, con, False)

    def migrate(self, migrations: list[mig.Migration]) -> list[str]:
        if self.read_only:
            raise StoreError("cannot migrate a read-only store connection")
        return mig.apply(self.con, migrations)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def first(cursor: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
    """The first row of a result, or None, draining it: DuckDB 2 treats a result read with
    fetchone() as unfinished and refuses other work on the connection until it is drained."""
    rows = cursor.fetchall()
    return rows[0] if rows else None


def open_sql(store: str | os.PathLike[str] | None = None, *, lock: bool = True) -> duckdb.DuckDBPyConnection:
    """A connection for user SQL: read-only, no file or network access at all, configuration locked.

    External access off still allows DuckDB's own files and its temp directory, so the local file
    system is switched off once the database is open (the open file is read through its handle) and
    nothing spills to a temp directory. Extensions are neither installed nor auto-loaded, and the
    locked configuration refuses any attempt to turn these back on.

    ``lock=False``: all of that but the lock, for a caller that still sets a setting of its own (a
    memory limit) and then locks it (``lock_sql``) before any user SQL runs on it.
    """
    root = resolve(store)
    db = _require(root)
    config = {
        "enable_external_access": False,
        "temp_directory": "",
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "allow_community_extensions": False,
    }
    con = _connect(db, read_only=True, config=config, lock_timeout_s=30.0)
    # A second connection in this process shares the first one's database, already locked down.
    if not sql_locked(con):
        con.execute("SET disabled_filesystems = 'LocalFileSystem'")
        if lock:
            lock_sql(con)
    try:  # the sandbox holds (current_setting does not show disabled_filesystems): a file is refused
        con.execute("SELECT count(*) FROM glob('/*')").fetchall()
    except duckdb.PermissionException:
        return con
    con.close()
    raise StoreError(f"{db} is open in this process without the SQL sandbox; close it first")


def sql_locked(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's configuration is locked (``lock_sql``)."""
    return bool(first(con.execute("SELECT current_setting('lock_configuration')"))[0])  # type: ignore[index]


def lock_sql(con: duckdb.DuckDBPyConnection) -> None:
    """Lock the connection's configuration (its database's, shared by every cursor): nothing run on
    it can change a setting any more, the sandbox's included."""
    con.execute("SET lock_configuration = true")
