"""The store as Parquet files a cluster tool reads: events, every SQL view, the score tables.

Layout::

    events/run_group=<n>/data_0.parquet   events of one group of runs (all their events)
    event_groups.parquet                  run_id -> run_group, events, path of its file
    runs.parquet, model_calls.parquet...  every view and score table, one file each

Each group (runs in run-id order, at least ``events_per_file`` events, a run never split) is one
``COPY``, on as many cursors as DuckDB has threads; the views of runs are written group by group
too and joined at the end, so what the export holds is bounded by a group (docs/interop.md).
Left out: the store's bookkeeping and the grade cache; blobs stay in the blob store.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import NamedTuple

import duckdb

from replay.bounded import drop_cache
from schemas.errors import AmbError

PRIVATE = {"spool_files", "_amb_migrations", "grade_cache"}
PARTITIONED = {"events"}
INDEX = "event_groups"
EVENTS_PER_FILE = 65_536
# No dictionary encoding: the hashes and payloads are unique, so building a dictionary for them is
# wasted; zstd packs the few repeated strings (run_id, kind, source) about as well.
FORMAT = "FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1, DICTIONARY_SIZE_LIMIT 1"
MERGED = f"{FORMAT}, ROW_GROUP_SIZE_BYTES '16MB'"
"""A view's file, merged from its pieces: its rows grow with the store, and DuckDB holds a row group
in memory until it writes it (by default 122,880 rows: over 100 MB of model calls)."""


class Written(NamedTuple):
    name: str
    rows: int
    partitioned: bool


class Group(NamedTuple):
    number: int
    first: str
    last: str
    runs: list[tuple[str, int]]
    """(run_id, events) of every run in the group, in run-id order."""

    @property
    def path(self) -> str:
        return f"events/run_group={self.number}/data_0.parquet"


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
    return [(n, n in with_run) for n in sorted(names, key=lambda n: (n != "events", n))]


def _quote(path: Path | str) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def groups(con: duckdb.DuckDBPyConnection, events_per_file: int, run_ids: list[str] | None) -> list[Group]:
    """The runs (``run_ids`` only, if given), in run-id order, cut into groups of at least
    ``events_per_file`` events; a run is never split."""
    where, params = (
        ("", []) if run_ids is None else (" WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [run_ids])
    )
    counts = con.execute(
        f"SELECT run_id, count(*) FROM events{where} GROUP BY run_id ORDER BY run_id", params
    ).fetchall()
    out: list[Group] = []
    runs: list[tuple[str, int]] = []
    held = 0
    for run_id, n in counts:
        runs.append((run_id, n))
        held += n
        if held >= events_per_file:
            out.append(Group(len(out), runs[0][0], run_id, runs))
            runs, held = [], 0
    if runs:
        out.append(Group(len(out), runs[0][0], runs[-1][0], runs))
    return out


class Job(NamedTuple):
    name: str
    sql: str
    params: list[object]
    counted: bool = True
    """False for a piece of a view: the view's rows are counted by the merge of its pieces."""


def export(
    con: duckdb.DuckDBPyConnection,
    out: Path,
    run_ids: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    overwrite: bool = False,
    only: list[str] | None = None,
    events_per_file: int = EVENTS_PER_FILE,
) -> list[Written]:
    """Write every table and view (or the ``only`` ones; of ``run_ids`` only, if given) under ``out``."""
    if events_per_file < 1:
        raise AmbError(f"events per file must be at least 1, not {events_per_file}")
    out = Path(out)
    made = not out.exists()
    if not made and any(out.iterdir()):
        if not overwrite:
            raise AmbError(f"{out} is not empty (give an empty or new folder, or --overwrite)")
        shutil.rmtree(out)
        made = True
    out.mkdir(parents=True, exist_ok=True)
    todo = [(n, r) for n, r in sources(con) if only is None or n in only]
    # Row order inside a Parquet file means nothing to its readers (they sort by run, source, seq),
    # and DuckDB writes faster in any order. The setting is the database's, so the cursors have it.
    previous = con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
    threads = int(con.execute("SELECT current_setting('threads')").fetchall()[0][0])
    con.execute("SET preserve_insertion_order = false")
    # Each COPY on one of DuckDB's threads, as many at once as it has: each thread of a COPY holds
    # its own buffers (a row group being filled, its JSON parsing), and one group's COPY is too
    # small to gain from more than one.
    con.execute("SET threads = 1")
    try:
        return _export(con, out, todo, run_ids, progress, events_per_file, threads)
    except BaseException:
        # Half an export (a full disk, an interrupt) would read as a whole one: what it wrote goes,
        # and so does the folder if it made it.
        _empty(out, remove=made)
        raise
    finally:
        con.execute(f"SET preserve_insertion_order = {'true' if previous else 'false'}")
        con.execute(f"SET threads = {threads}")


def _empty(folder: Path, *, remove: bool) -> None:
    if remove:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


PARTS = ".parts"
"""The folder under OUT where a view's pieces wait for their merge (removed after)."""


def _ranges(grouped: list[Group], null_ids: bool) -> list[tuple[str, list[object]]]:
    """A ``WHERE`` clause and its parameters per group, the groups' run-id ranges stretched to meet
    (and one for rows of no run id, if a table may hold them): together they hold every row, those
    of runs without events included. Each is a filter the scan itself applies (an ``OR`` is not)."""
    starts: list[object] = [g.first for g in grouped[1:]]
    bounds: list[tuple[str, list[object]]] = [("run_id < ?", [starts[0]])]
    bounds += [("run_id >= ? AND run_id < ?", [a, b]) for a, b in zip(starts, starts[1:], strict=False)]
    bounds.append(("run_id >= ?", [starts[-1]]))
    return [*bounds, ("run_id IS NULL", [])] if null_ids else bounds


def _null_run_ids(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether a table may hold rows of no run id. The views take their run id from a row of a table
    (the kept side of their joins), so when every table refuses NULL, so do they; and a view's pass
    over rows of NULL run id would read all of it (the filter does not reach a join's other side)."""
    return bool(
        con.execute(
            "SELECT count(*) FROM duckdb_columns() WHERE column_name = 'run_id' AND is_nullable "
            "AND table_name IN (SELECT table_name FROM duckdb_tables())"
        ).fetchall()[0][0]
    )


def _batches(
    out: Path,
    todo: list[tuple[str, bool]],
    run_ids: list[str] | None,
    grouped: list[Group],
    null_ids: bool,
) -> tuple[list[list[Job]], dict[str, list[Path]]]:
    """The COPYs to run, a batch per group of runs (a batch's COPYs in any order, at once; the tables
    of no runs in the first), and per view written in pieces, its pieces."""
    # Run ids go in as a list parameter: a temp table would not be seen by the other cursors.
    in_subset = " AND run_id IN (SELECT unnest(?::VARCHAR[]))" if run_ids is not None else ""
    batches: list[list[Job]] = [[] for _ in range(max(1, len(grouped)))]
    pieces: dict[str, list[Path]] = {}
    for name, per_run in todo:
        select = f'SELECT * FROM "{name}"'
        if name in PARTITIONED:
            # No runs: one empty group, so the layout (and a reader's glob) is the same.
            for g in grouped or [Group(0, "", "", [])]:
                (out / g.path).parent.mkdir(parents=True)
                where = f" WHERE run_id BETWEEN ? AND ?{in_subset}" if g.runs else " WHERE false"
                params: list[object] = [g.first, g.last] if g.runs else []
                if g.runs and run_ids is not None:
                    params.append([r for r, _ in g.runs])
                sql = f"COPY ({select}{where}) TO {_quote(out / g.path)} ({FORMAT})"
                batches[g.number].append(Job(name, sql, params))
            continue
        subset: list[object] = [run_ids] if run_ids is not None and per_run else []
        if per_run and len(grouped) > 1:
            # A view of the whole store at once (a join of all tool calls with their results, a
            # window over all scores) holds the whole store in memory; run group by run group, it
            # holds one group's, and the pieces are joined into one file after (``_merge``).
            folder = out / PARTS / name
            folder.mkdir(parents=True)
            for i, (where, params) in enumerate(_ranges(grouped, null_ids)):
                piece = folder / f"{i}.parquet"
                sql = f"COPY ({select} WHERE {where}{in_subset}) TO {_quote(piece)} ({FORMAT})"
                batches[min(i, len(grouped) - 1)].append(Job(name, sql, [*params, *subset], counted=False))
                pieces.setdefault(name, []).append(piece)
            continue
        if subset:
            select += " WHERE run_id IN (SELECT unnest(?::VARCHAR[]))"
        sql = f"COPY ({select}) TO {_quote(out / f'{name}.parquet')} ({FORMAT})"
        batches[0].append(Job(name, sql, subset))
    return batches, pieces


def _merge(name: str, out: Path, pieces: list[Path]) -> Job:
    """The COPY that joins a view's pieces into its one file: a stream of their rows."""
    files = ", ".join(_quote(p) for p in pieces)
    target = _quote(out / f"{name}.parquet")
    return Job(name, f"COPY (SELECT * FROM read_parquet([{files}])) TO {target} ({MERGED})", [])


def _export(
    con: duckdb.DuckDBPyConnection,
    out: Path,
    todo: list[tuple[str, bool]],
    run_ids: list[str] | None,
    progress: Callable[[int, int], None] | None,
    events_per_file: int,
    threads: int,
) -> list[Written]:
    grouped = groups(con, events_per_file, run_ids)
    batches, pieces = _batches(out, todo, run_ids, grouped, _null_run_ids(con))
    batches.append([_merge(n, out, p) for n, p in pieces.items()])
    rows = dict.fromkeys((n for n, _ in todo), 0)
    total = sum(map(len, batches)) + 1

    def run(job: Job) -> int:
        # A cursor is a connection of its own to the same database: COPYs on several cursors run
        # at once.
        with con.cursor() as cur:
            # COPY returns the number of rows it wrote: no second pass over a view to count them.
            return int(cur.execute(job.sql, job.params).fetchall()[0][0])

    done = 0
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="amb-parquet") as pool:
        for batch in batches:
            futures = {pool.submit(run, job): job for job in batch}
            for future in as_completed(futures):
                n, job = future.result(), futures[future]
                rows[job.name] += n if job.counted else 0
                done += 1
                if progress:  # from this thread only: a progress bar is not thread-safe
                    progress(done, total)
            # The blocks of the file this group read stay cached until memory runs short, and
            # the next groups read others: without this, the export ends holding the whole file.
            drop_cache(con)
    shutil.rmtree(out / PARTS, ignore_errors=True)
    written = [Written(n, rows[n], n in PARTITIONED) for n, _ in todo]
    if any(n in PARTITIONED for n, _ in todo):
        written.insert(1, Written(INDEX, _write_index(con, out, grouped), False))
    if progress:
        progress(total, total)
    return written


def _write_index(con: duckdb.DuckDBPyConnection, out: Path, grouped: list[Group]) -> int:
    """``event_groups.parquet``: for every run, its group, its number of events and its file."""
    runs = [(run_id, g.number, n, g.path) for g in grouped for run_id, n in g.runs]
    columns = [list(c) for c in zip(*runs, strict=True)] if runs else [[], [], [], []]
    return int(
        con.execute(
            "COPY (SELECT unnest(?::VARCHAR[]) AS run_id, unnest(?::INTEGER[]) AS run_group, "
            "unnest(?::BIGINT[]) AS events, unnest(?::VARCHAR[]) AS path) "
            f"TO {_quote(out / f'{INDEX}.parquet')} ({FORMAT})",
            columns,
        ).fetchall()[0][0]
    )


def read_glob(out: Path, name: str, partitioned: bool) -> str:
    """The ``read_parquet`` argument that reads table ``name`` of an export back."""
    if partitioned:
        files = _quote(out / name / "**" / "*.parquet")
        return f"read_parquet({files}, hive_partitioning = true, hive_types = {{'run_group': 'INTEGER'}})"
    return f"read_parquet({_quote(out / f'{name}.parquet')})"
