"""``amb gc``: remove what runs whose recorder was killed left behind (containers, networks,
host firewall rules, temp dirs); live runs are never touched (``recorder.gc``). ``amb gc --blobs``
instead removes the blobs nothing refers to (``replay.blob_gc``)."""

from __future__ import annotations

import json

import click

from amb.common import store_option
from amb.output import emit
from schemas.blobstore import BlobStore


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--blobs", "blobs", is_flag=True, help="Remove unreferenced blobs (repack) instead.")
@store_option
@click.option(
    "--wait", "wait_s", type=float, default=30.0, show_default=True, help="Seconds to wait for writers."
)
def gc(as_json: bool, blobs: bool, store: str, wait_s: float) -> None:
    """Remove the leftovers of runs whose amb-record is gone, and say what was removed."""
    if blobs:
        _gc_blobs(store, wait_s, as_json)
        return
    from recorder.gc import collect

    removed, problems = collect(docker=True)
    rows = [(r.run_id, r.kind, r.name) for r in removed]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "removed": [dict(zip(("run_id", "kind", "name"), r, strict=True)) for r in rows],
                    "problems": problems,
                },
                indent=2,
            )
        )
    elif rows:
        emit(("run_id", "kind", "name"), rows)
    else:
        click.echo("nothing to remove: no run left anything behind")
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
        click.echo(
            f"{done.removed} unreferenced blobs removed ({done.reclaimed} bytes); {done.live} referenced "
            f"addresses kept; packs {done.packs_before} -> {done.packs_after}"
        )
    for problem in done.problems:
        click.echo(f"amb: error: {problem}", err=True)
    if done.problems:
        raise SystemExit(1)


commands = [gc]
