"""``amb blobs migrate``: move a store's loose blob files into packs (``replay.blob_migrate``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from amb.common import exit_on, progress, store_option
from replay.store import resolve
from schemas.blobstore import BlobStore
from schemas.errors import NotFound


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
    if not (root / "amb.duckdb").exists() and not (root / "blobs").is_dir():
        raise NotFound(f"no store at {root}: no database and no blobs there (check --store or AMB_STORE)")
    store_blobs = BlobStore(Path(root) / "blobs")
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


commands = [blobs]
