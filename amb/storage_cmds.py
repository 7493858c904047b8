"""The store's upkeep: ``amb store stats`` (``replay.stats``), ``amb blobs migrate``
(``replay.blob_migrate``) and ``amb gc``: what killed amb processes left behind, never what a live
one owns (``recorder.gc``; the cluster's job epilog, docs/scale-out.md), or with ``--blobs`` the
blobs nothing refers to (``replay.blob_gc``)."""

from __future__ import annotations

import json

import click

from amb.common import exit_on, progress, store_option
from amb.output import emit
from replay.stats import stats as store_stats
from replay.store import DB_NAME, Store, resolve
from schemas.blobstore import BlobStore
from schemas.errors import NotFound


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


@click.group()
def blobs() -> None:
    """The blob store's packs."""


@blobs.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def migrate(store: str, as_json: bool) -> None:
    """Move loose blob files into packs, every hash checked; safe to kill and run again."""
    from replay.blob_migrate import migrate as run

    root = resolve(store)
    if not (root / DB_NAME).exists() and not (root / "blobs").is_dir():
        raise NotFound(f"no store at {root}: no database and no blobs there (check --store or AMB_STORE)")
    store_blobs = BlobStore(root / "blobs")
    done = run(store_blobs, progress("migrate blobs"))
    usage = store_blobs.usage()
    if as_json:
        click.echo(json.dumps(done._asdict() | {"usage": usage._asdict()}, indent=2))
    else:
        click.echo(
            f"{done.packed} loose blobs packed, {done.already} packed by an earlier run; "
            f"{usage.packs} packs, {usage.loose_files} loose files left"
        )
    exit_on(done.bad)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--blobs", "blobs", is_flag=True, help="Remove unreferenced blobs (repack) instead.")
@store_option
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for writers.",
)
def gc(as_json: bool, blobs: bool, store: str, wait_s: float) -> None:
    """Remove what killed amb processes left behind (runs' containers, networks, firewall rules,
    temp dirs), and say what was removed."""
    if blobs:
        _gc_blobs(store, wait_s, as_json)
        return
    from recorder.gc import collect

    removed, problems = collect(docker=True)
    if as_json:
        # run_id null: what a process made outside any run (a sweep execution's workspace).
        rows = [{"run_id": r.run_id or None, "kind": r.kind, "name": r.name} for r in removed]
        click.echo(json.dumps({"removed": rows, "problems": problems}, indent=2))
    elif removed:
        emit(("run_id", "kind", "name"), [(r.run_id or "-", r.kind, r.name) for r in removed])
    else:
        click.echo("nothing to remove: no amb process that is gone left anything behind")
    for problem in problems:
        click.echo(f"amb: warning: {problem}", err=True)


def _gc_blobs(store: str, wait_s: float, as_json: bool) -> None:
    from replay.blob_gc import collect

    root = resolve(store)
    with Store.open(root, read_only=True):
        pass  # a missing store is one clear error, before any lock is taken
    blobs = BlobStore(root / "blobs")
    done = collect(blobs, root / "spool", lambda: Store.open(root, read_only=True).con, wait_s=wait_s)
    if as_json:
        click.echo(json.dumps(done._asdict(), indent=2))
    else:
        n = done.indexes_rebuilt
        rebuilt = f"; {n} pack(s) without their index rewritten" if n else ""
        click.echo(
            f"{done.removed} unreferenced blobs removed ({done.reclaimed} bytes); {done.live} referenced "
            f"addresses kept; packs {done.packs_before} -> {done.packs_after}{rebuilt}"
        )
    exit_on(done.problems)


commands = [store, blobs, gc]
