"""The store as Parquet files a cluster tool reads: events, every SQL view, the score tables.

``events`` is hive-partitioned by run (``events/run_id=<id>/data_0.parquet``), so Spark, DuckDB,
polars and pandas/pyarrow read one run's events without touching the others; every view and score
table is one file (``runs.parquet``, ``model_calls.parquet``, ...): they are small beside the
events, and partitioning them into a file per run tripled their write time for nothing a reader
needs. An export of a few runs (``--runs``) has the same layout. DuckDB's ``COPY ... TO`` writes
the files; nothing passes through Python rows.
Snappy compression: two to three times faster to write than zstd here (the payloads and hashes
dominate), and every Parquet reader has it.

Left out on purpose: the store's bookkeeping (``spool_files``, ``_amb_migrations``) and the grade
cache, which are not facts about runs. Blobs stay in the blob store; their addresses are in the
payloads.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import duckdb

from schemas.errors import AmbError

PRIVATE = {"spool_files", "_amb_migrations", "grade_cache"}
PARTITIONED = {"events"}


class Written(NamedTuple):
    name: str
    rows: int
    partitioned: bool


def sources(con: duckdb.DuckDBPyConnection) -> list[tuple[str, bool]]:
    """(name, has a run_id column) of every table and view worth exporting, events first."""
    names = [
        r[0]
        for r in con.execute(
            """SELECT table_name FROM duckdb_tables() WHERE NOT internal AND schema_name = 'main'
               UNION ALL
               SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'"""
        ).fetchall()
        if r[0] not in PRIVATE and not r[0].startswith("_")
    ]
    with_run = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id'"
        ).fetchall()
    }
    ordered = sorted(names, key=lambda n: (n != "events", n))
    return [(n, n in with_run) for n in ordered]


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def export(
    con: duckdb.DuckDBPyConnection,
    out: Path,
    run_ids: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    overwrite: bool = False,
    only: list[str] | None = None,
) -> list[Written]:
    """Write every table and view (or the ``only`` ones; of ``run_ids`` only, if given) under ``out``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise AmbError(f"{out} is not empty (give an empty or new folder, or --overwrite)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [(n, r) for n, r in sources(con) if only is None or n in only]
    # Row order inside a Parquet file means nothing to its readers (they sort by run, source, seq);
    # letting DuckDB write in any order made the partitioned events write 1.6x faster (measured).
    previous = con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
    con.execute("SET preserve_insertion_order = false")
    try:
        return _export(con, out, todo, run_ids, progress)
    finally:
        con.execute(f"SET preserve_insertion_order = {'true' if previous else 'false'}")


def _export(
    con: duckdb.DuckDBPyConnection,
    out: Path,
    todo: list[tuple[str, bool]],
    run_ids: list[str] | None,
    progress: Callable[[int, int], None] | None,
) -> list[Written]:
    written: list[Written] = []
    if run_ids is not None:
        con.execute("CREATE OR REPLACE TEMP TABLE _amb_export_runs (run_id VARCHAR)")
        con.executemany("INSERT INTO _amb_export_runs VALUES (?)", [[r] for r in run_ids])
    for i, (name, per_run) in enumerate(todo):
        if progress:
            progress(i, len(todo))
        select = f'SELECT * FROM "{name}"'
        if run_ids is not None and per_run:
            select += " WHERE run_id IN (SELECT run_id FROM _amb_export_runs)"
        # COPY returns the number of rows it wrote: no second pass over a view to count them.
        n, partitioned = 0, name in PARTITIONED
        if partitioned:
            n = con.execute(
                f"COPY ({select}) TO {_quote(out / name)} "
                "(FORMAT parquet, PARTITION_BY (run_id), COMPRESSION snappy, OVERWRITE_OR_IGNORE)"
            ).fetchall()[0][0]
            # An empty partitioned COPY writes no file: an empty table is one file with its schema.
            partitioned = n > 0
        if not partitioned:
            n = con.execute(
                f"COPY ({select}) TO {_quote(out / f'{name}.parquet')} (FORMAT parquet, COMPRESSION snappy)"
            ).fetchall()[0][0]
        written.append(Written(name, int(n), partitioned))
    if progress:
        progress(len(todo), len(todo))
    return written


def read_glob(out: Path, name: str, partitioned: bool) -> str:
    """The ``read_parquet`` argument that reads table ``name`` of an export back."""
    if partitioned:
        files = _quote(out / name / "**" / "*.parquet")
        return f"read_parquet({files}, hive_partitioning = true, hive_types = {{'run_id': 'VARCHAR'}})"
    return f"read_parquet({_quote(out / f'{name}.parquet')})"
