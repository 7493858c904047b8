"""``amb store stats``: what the store takes on disk and what it holds (``replay.stats``)."""

from __future__ import annotations

import json

import click

from amb.common import store_option
from amb.output import emit
from replay.stats import stats as store_stats
from replay.store import Store


@click.group()
def store() -> None:
    """The store itself: what it takes on disk."""


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


@store.command("stats")
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--no-runs", is_flag=True, help="Leave out the per-run rows.")
def stats(store: str, as_json: bool, no_runs: bool) -> None:
    """On-disk bytes (as du counts them) and content bytes of the database and its tables, the blob
    area (loose blobs, packs, whatever its files are) and the spools, in total and per run."""
    with Store.open(store, read_only=True) as st:
        found = store_stats(st.con, st.root, per_run=not no_runs)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    total = found["total"]
    click.echo(
        f"store {store}: {found['events']:,} events, {_mb(total['disk_bytes'])} on disk "
        f"({total['disk_bytes_per_event'] or 0:,.0f} bytes per event), {_mb(total['content_bytes'])} content"
    )
    db = found["database"]
    rows = [["database", db["files"], db["disk_bytes"], db["content_bytes"]]]
    for table, t in db["tables"].items():
        rows.append([f"  table {table} ({t['rows']:,} rows)", "", t["disk_bytes"], t["content_bytes"]])
    for area in ("blobs", "spools"):
        a = found[area]
        rows.append([area, a["files"], a["disk_bytes"], a["content_bytes"]])
        for kind, k in sorted(a["kinds"].items()):
            rows.append([f"  {kind}", k["files"], k["disk_bytes"], k["content_bytes"]])
    emit(["what", "files", "disk_bytes", "content_bytes"], rows)
    if not no_runs:
        click.echo("")
        columns = (
            "run_id events event_bytes spool_disk_bytes spool_content_bytes blob_refs blob_bytes".split()
        )
        emit(columns, [[r[c] for c in columns] for r in found["runs"]])


commands = [store]
