"""The store as Parquet files a cluster tool reads: events, every SQL view, the score tables.

One folder per table or view under the output directory. Everything with a ``run_id`` column is
hive-partitioned by it (``events/run_id=<id>/data_0.parquet``), so Spark, DuckDB, polars and
pandas/pyarrow read one run without touching the others, and an export of a few runs (``runs``)
is the same layout. DuckDB's ``COPY ... TO`` writes the files; nothing passes through Python rows.

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
) -> list[Written]:
    """Write every table and view (of ``run_ids`` only, if given) under ``out``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise AmbError(f"{out} is not empty (give an empty or new folder, or --overwrite)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = sources(con)
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
        n = con.execute(f"SELECT count(*) FROM ({select})").fetchall()[0][0]
        if n == 0 and per_run:
            # An empty partitioned COPY writes no file: write the schema so readers still find it.
            con.execute(f"COPY ({select}) TO {_quote(out / f'{name}.empty.parquet')} (FORMAT parquet)")
        elif per_run:
            con.execute(
                f"COPY ({select}) TO {_quote(out / name)} "
                "(FORMAT parquet, PARTITION_BY (run_id), COMPRESSION zstd, OVERWRITE_OR_IGNORE)"
            )
        else:
            con.execute(
                f"COPY ({select}) TO {_quote(out / f'{name}.parquet')} (FORMAT parquet, COMPRESSION zstd)"
            )
        written.append(Written(name, int(n), per_run))
    if progress:
        progress(len(todo), len(todo))
    return written


def read_glob(out: Path, name: str, partitioned: bool) -> str:
    """The ``read_parquet`` argument that reads table ``name`` of an export back."""
    if partitioned and (out / name).is_dir():
        files = _quote(out / name / "**" / "*.parquet")
        return f"read_parquet({files}, hive_partitioning = true, hive_types = {{'run_id': 'VARCHAR'}})"
    suffix = ".parquet" if not partitioned else ".empty.parquet"
    return f"read_parquet({_quote(out / f'{name}{suffix}')})"
