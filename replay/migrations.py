"""Named, transactional schema migrations for the DuckDB store.

A migration is a (name, function) pair. ``apply`` runs, in order, each one whose name is not yet
in ``_amb_migrations``, inside one transaction together with its bookkeeping row, so a failed
migration leaves nothing behind. Names are never reused; a change is a new migration. A migration
that is given a better name keeps its old one in ``formerly``, so stores that recorded it under the
old name do not run it again.
Other layers (the scorer's tables) bring their own ``Migrations`` lists; names are global, so each
set prefixes its names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import duckdb

from replay import hot, views
from replay.transaction import transaction


class Migration(NamedTuple):
    name: str
    apply: Callable[[duckdb.DuckDBPyConnection], None]
    formerly: tuple[str, ...] = ()


def _sql(*statements: str) -> Callable[[duckdb.DuckDBPyConnection], None]:
    def run(con: duckdb.DuckDBPyConnection) -> None:
        for statement in statements:
            con.execute(statement)

    return run


def _hot_columns(con: duckdb.DuckDBPyConnection) -> None:
    hot.add_and_backfill(con)
    views.create_views(con)


def _payload_zstd(con: duckdb.DuckDBPyConnection) -> None:
    """Rebuild ``events`` with its payload column compressed by zstd (docs/storage.md): a column's
    compression is fixed when its table is created, so the rows are copied, in key order, to a new
    table with every column as it is."""
    cols = con.execute(
        "SELECT column_name, data_type, is_nullable FROM duckdb_columns() "
        "WHERE schema_name = 'main' AND table_name = 'events' ORDER BY column_index"
    ).fetchall()
    ddl = ", ".join(
        f'"{name}" {sql_type}'
        + ("" if nullable else " NOT NULL")
        + (" USING COMPRESSION zstd" if name == "payload" else "")
        for name, sql_type, nullable in cols
    )
    con.execute(f"CREATE TABLE events_new ({ddl})")
    con.execute("INSERT INTO events_new SELECT * FROM events ORDER BY run_id, source, seq")
    con.execute("DROP TABLE events")
    con.execute("ALTER TABLE events_new RENAME TO events")
    views.create_views(con)


CORE: list[Migration] = [
    Migration(
        "core.m001_events",
        _sql(
            # The raw, immutable log. (run_id, source, seq) is the key, guarded by ingest and checked
            # by verify, not declared (the index doubles bulk-load time: docs/storage.md). payload
            # keeps the canonical JSON text byte for byte, so verify re-derives every hash in SQL.
            """
            CREATE TABLE events (
                run_id    VARCHAR NOT NULL,
                source    VARCHAR NOT NULL,
                seq       BIGINT  NOT NULL,
                kind      VARCHAR NOT NULL,
                v         INTEGER NOT NULL,
                ts_ns     BIGINT  NOT NULL,
                payload   JSON    NOT NULL,
                prev_hash VARCHAR NOT NULL,
                hash      VARCHAR NOT NULL
            )
            """,
            # One row per spool file already loaded, so a re-ingest skips unchanged files without
            # reading them (a 1,000-run store is not re-hashed on every amb-record exit).
            """
            CREATE TABLE spool_files (
                path        VARCHAR PRIMARY KEY,
                run_id      VARCHAR NOT NULL,
                source      VARCHAR NOT NULL,
                size        BIGINT  NOT NULL,
                frames      BIGINT  NOT NULL,
                last_hash   VARCHAR,
                torn_bytes  BIGINT  NOT NULL,
                ingested_at TIMESTAMP NOT NULL
            )
            """,
            # Written once per finished run, for anchoring elsewhere (amb manifest / verify --manifest).
            """
            CREATE TABLE manifests (
                run_id     VARCHAR PRIMARY KEY,
                manifest   JSON NOT NULL,
                created_at TIMESTAMP NOT NULL
            )
            """,
        ),
    ),
    Migration("core.m002_views", views.create_views),
    # network_requests gained the `blocked` column (the proxy's refusals); the views are re-created.
    Migration("core.m003_views_network_blocked", views.create_views),
    # model_calls gained requested_model, served_model, upstream and reported_cost_usd: a store made
    # before gets the views again (CREATE OR REPLACE: the columns are the current ones).
    Migration("core.m004_views_gateway_fields", views.create_views),
    # Typed hot columns (replay.hot): added to events, filled from the payloads already stored, and
    # the views re-created to read them.
    Migration("core.m005_hot_columns", _hot_columns, formerly=("core.m005_i22_hot_columns",)),
    # The payload column compressed with zstd (the table rebuilt, rows copied; views re-created).
    Migration("core.m006_payload_zstd", _payload_zstd, formerly=("core.m006_i22_payload_zstd",)),
    # The hot column ``ok`` (what the runs' failed-call counts read): added to a store already past
    # m005 and filled; a store that m005 itself migrated has it already.
    Migration("core.m007_hot_column_ok", _hot_columns),
    # The views read a typed payload field with TRY_CAST: a field of another type is NULL, not an
    # error that stops every query of the view.
    Migration("core.m008_views_try_cast", views.create_views),
]


def ensure_table(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS _amb_migrations (
            name           VARCHAR PRIMARY KEY,
            applied_at     TIMESTAMP NOT NULL,
            duckdb_version VARCHAR NOT NULL
        )
        """
    )


def applied(con: duckdb.DuckDBPyConnection) -> set[str]:
    ensure_table(con)
    return {row[0] for row in con.execute("SELECT name FROM _amb_migrations").fetchall()}


def pending(con: duckdb.DuckDBPyConnection, migrations: list[Migration]) -> list[Migration]:
    done = applied(con)
    names = [m.name for m in migrations]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate migration names in {names}")
    return [m for m in migrations if m.name not in done and done.isdisjoint(m.formerly)]


def apply(con: duckdb.DuckDBPyConnection, migrations: list[Migration]) -> list[str]:
    """Apply what is pending, each in its own transaction; returns the names applied."""
    done = []
    for migration in pending(con, migrations):
        with transaction(con):
            migration.apply(con)
            con.execute(
                "INSERT INTO _amb_migrations VALUES (?, now(), ?)", [migration.name, duckdb.__version__]
            )
        done.append(migration.name)
    return done
