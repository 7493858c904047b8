"""``amb ingest --from DIR...``: shards and other stores into this store (``replay.shards``), with the
sweep's rule of one result per cell (``sweeps.collect``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from amb.common import progress, say_error
from replay.shards import LoadReport, load_shards, merge_store
from schemas.display import for_message
from sweeps.collect import is_sweep_root, select
from sweeps.shard import SHARD_FILE, Layout


def ingest_from(
    store: str, sources: list[Path], *, as_json: bool = False, spool_mode: str | None = None
) -> int:
    """Load every source; returns the exit status: 1 when anything was refused, 2 when all that was
    refused is a run whose id the store holds for a different run (bad input, as ``RunExists``)."""
    t0 = time.monotonic()
    out: list[dict[str, Any]] = []
    failed = taken = False
    for source in sources:
        source = source.resolve()
        duplicates: list[str] = []
        refused: list[tuple[str, str]] = []
        if is_sweep_root(source):
            kind = "sweep"
            sel = select(Layout(source))
            duplicates = [str(p) for p in sel.duplicates]
            refused = list(sel.refused)
            report = load_shards(
                store, sel.take, progress=progress(f"shards of {source.name}"), spool_mode=spool_mode
            )
        elif (source / SHARD_FILE).is_file():
            kind = "shard"
            report = load_shards(store, [(source, source.name)], spool_mode=spool_mode)
        elif (source / "spool").is_dir():
            kind = "store"
            report = merge_store(
                store, source, progress=progress(f"runs of {source.name}"), spool_mode=spool_mode
            )
        else:
            say_error(f"{source}: not a sweep directory (shards/), a shard (shard.json) or a store (spool/)")
            failed = True
            continue
        taken = taken or bool(report.taken)
        failed = failed or bool(refused) or len(report.refused) > len(report.taken)
        refused += report.refused
        out.append(_summary(source, kind, report, duplicates, refused))
    took = time.monotonic() - t0
    if as_json:
        click.echo(json.dumps({"sources": out, "seconds": round(took, 3)}, indent=2))
    else:
        for s in out:
            for path, why in s["refused"]:
                say_error(f"{path}: refused: {why}")  # names from the directories loaded: escaped
            click.echo(
                f"{for_message(s['source'], 4096)} ({s['kind']}): {len(s['loaded'])} run(s) loaded, "
                f"{s['events_added']} new events, "
                f"{s['spools_copied']} spool(s) and {s['blobs_copied']} blob(s) copied; "
                f"{len(s['duplicates'])} duplicate(s) kept aside, {len(s['refused'])} refused"
            )
    return 1 if failed else 2 if taken else 0


def _summary(
    source: Path, kind: str, report: LoadReport, duplicates: list[str], refused: list[tuple[str, str]]
) -> dict[str, Any]:
    ing = report.ingest
    return {
        "source": str(source),
        "kind": kind,
        "loaded": report.loaded,
        "events_added": ing.events_added if ing else 0,
        "spools_copied": report.spools_copied,
        "blobs_copied": report.blobs_copied,
        "duplicates": duplicates,
        "refused": [list(r) for r in refused],
        "ingest_failed": [list(f) for f in (ing.failed if ing else [])],
    }
