"""``amb gc``: remove what amb processes that were killed left behind (a run's container, network,
host firewall rules and temp dirs; any process's temp dirs and lock files, such as a sweep
execution's workspace); what a live process owns is never touched (``recorder.gc``). It is the
cluster's job epilog (docs/scale-out.md). ``amb gc --blobs`` instead removes the blobs nothing
refers to (``replay.blob_gc``)."""

from __future__ import annotations

import json

import click

from amb.common import exit_on, store_option
from amb.output import emit
from schemas.blobstore import BlobStore


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
    from replay.store import Store, resolve

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


commands = [gc]
