"""Commands that write or check the event store: ingest, verify, generate (the ones that only read it
are in ``amb.query_cmds``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from amb.common import int_option, progress, say_error, store_option, stored_only
from recorder.synthetic import MAX_CALLS, MAX_SEED, generate_run
from replay import spools as spool_modes
from replay.ingest import ingest as ingest_store
from replay.manifest import check_anchored
from replay.read import require_runs
from replay.store import DB_NAME, Store, resolve
from replay.verify import verify as verify_store
from schemas.blobpack import SUFFIX
from schemas.blobstore import BlobStore
from schemas.codec import ID_RE
from schemas.display import for_message
from schemas.errors import AmbError, NotFound, UsageError
from schemas.run_claim import require_free
from schemas.untrusted_json import check_json_depth
from schemas.userfile import read_text


@click.command()
@store_option
@click.option(
    "--spools",
    type=click.Choice(spool_modes.MODES),
    envvar=spool_modes.ENV,
    default=spool_modes.DEFAULT_MODE,
    show_default=True,
    help="What becomes of a finished run's spools once ingested (except the recorder's): compress "
    "(zstd), drop, or keep as written. Env: AMB_SPOOLS.",
)
@click.argument("runs", nargs=-1)
@click.option(
    "--from",
    "sources",
    multiple=True,
    type=click.Path(file_okay=False, exists=True),
    metavar="DIR",
    help="Load from DIR instead of the store's own spools: a sweep's shared directory (one result per "
    "cell; duplicates are listed, not loaded), a single shard, or another store (merged). Repeatable.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="With --from: print what was loaded and refused as JSON."
)
def ingest(store: str, spools: str, runs: tuple[str, ...], sources: tuple[str, ...], as_json: bool) -> None:
    """Load spools into the store (all runs, or RUNS), verifying checksums and hash chains.

    A spool that fails its checks is left out (nothing of it is stored); every other one is loaded.
    Each bad spool is named, and the exit code is non-zero.
    """
    if sources:
        if runs:
            raise UsageError("give RUNS or --from DIR, not both")
        sys.exit(_ingest_from(store, [Path(s) for s in sources], as_json=as_json, spool_mode=spools))
    # Something to ingest, or a store already there: a mistyped --store is not made a new, empty
    # store, and a RUN with neither spools nor events is not found.
    root = resolve(store)
    if not (root / DB_NAME).exists() and not (root / "spool").is_dir():
        raise NotFound(f"no store and no spools at {root}: nothing to ingest (check --store or AMB_STORE)")
    stored_only(store, runs)
    try:
        report = ingest_store(store, list(runs) or None, progress=progress("ingest"), spool_mode=spools)
    except AmbError as e:
        partial = getattr(e, "report", None)
        if partial is None:
            raise
        _say_ingested(partial)
        for path, why in partial.failed:
            say_error(f"{path}: not loaded: {why}")
        sys.exit(e.exit_code)
    _say_ingested(report)


def _ingest_from(store: str, sources: list[Path], *, as_json: bool, spool_mode: str) -> int:
    """``amb ingest --from``: shards and other stores into this store (``replay.shards``), with the
    sweep's rule of one result per cell (``sweeps.collect``). Returns the exit status: 1 when
    anything was refused, 2 when all that was refused is a run whose id the store holds for a
    different run (bad input, as ``RunExists``)."""
    from replay.shards import load_shards, merge_store
    from sweeps.collect import is_sweep_root, select
    from sweeps.shard import SHARD_FILE, Layout

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
        ing = report.ingest
        out.append(
            {
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
        )
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


def _say_ingested(report) -> None:
    for torn in report.torn:
        assert torn.tail is not None
        click.echo(
            f"amb: warning: {torn.path}: torn tail at byte {torn.tail.offset} ({torn.tail.length} bytes, "
            f"{torn.tail.why}); kept the {torn.frames} complete "
            f"{'blob records' if torn.path.endswith(SUFFIX) else 'events'} before it",
            err=True,
        )
    click.echo(
        f"ingested {report.events_added} new events ({report.events_read} read) from "
        f"{report.files_loaded} of {report.files_seen} spool files; runs: {len(report.runs)}"
        + (
            f"; {report.blobs_materialised} blobs from packs of unclosed recorders"
            if report.blobs_materialised
            else ""
        )
        + "".join(f"; {n} spools {what}" for what, n in report.settled.items() if n)
    )


@click.command()
@store_option
@click.argument("runs", nargs=-1)
@click.option(
    "--manifest",
    "manifest_file",
    type=click.Path(dir_okay=False, exists=True),
    help="Check against manifests kept elsewhere (JSON object, list, or one per line).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the problems as JSON.")
def verify(store: str, runs: tuple[str, ...], manifest_file: str | None, as_json: bool) -> None:
    """Re-derive every hash and check chains, manifests and blobs; exit 1 on any problem."""
    anchored = _read_manifests(manifest_file) if manifest_file else None
    with Store.open(store, read_only=True) as st:
        run_ids = require_runs(st.con, runs, st.root) or None
        problems = verify_store(st.con, st.blobs, run_ids, anchored, progress("verify blobs"))
        # What was verified: the runs named (each once), else every run.
        (n_runs, n_events), *_ = st.con.execute(
            "SELECT count(DISTINCT run_id), count(*) FROM events"
            + (" WHERE run_id IN (SELECT unnest(?))" if run_ids else ""),
            [run_ids] if run_ids else [],
        ).fetchall()
    if as_json:
        click.echo(json.dumps([p._asdict() | {"message": str(p)} for p in problems], indent=2))
    if problems:
        if not as_json:
            click.echo(f"FAIL {problems[0]}")
            for p in problems[1:10]:
                click.echo(f"     {p}")
            if len(problems) > 10:
                click.echo(f"     … {len(problems) - 10} more problems")
        raise SystemExit(1)
    if not as_json:
        click.echo(f"OK {n_events} events verified in {n_runs} run{'' if n_runs == 1 else 's'}")


def _read_manifests(path: str) -> list[dict]:
    text = read_text(Path(path), "--manifest").strip()
    try:
        check_json_depth(text)  # (a line's depth is at most the whole text's)
    except ValueError as e:
        raise UsageError(f"{path}: not a manifest: {e}") from None
    try:
        data = json.loads(text)
        found = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            found = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}: not a manifest (JSON object, list, or JSON lines): {e}") from e
    try:
        return check_anchored(found, path)
    except ValueError as e:
        raise UsageError(str(e)) from None


@click.command()
@store_option
@click.option(
    "--runs", "n_runs", default=5, show_default=True, type=click.IntRange(min=1), help="How many runs."
)
@int_option(
    "--calls",
    35,
    1,
    MAX_CALLS,
    "Model calls per run (each request carries the whole conversation so far: it grows as calls²).",
)
@int_option(
    "--seed", 0, 0, MAX_SEED, "Seed of the first run (run i uses seed+i; it also sets the run's clock)."
)
@click.option("--prefix", default="synth", show_default=True, help="Run id prefix (ids are PREFIX-SEED).")
@int_option(
    "--processes-per-call",
    1,
    1,
    100_000,
    "Processes the shim sees per tool call (a big run without a quadratic conversation).",
)
def generate(store: str, n_runs: int, calls: int, seed: int, prefix: str, processes_per_call: int) -> None:
    """Write synthetic runs through the real spool path (then run `amb ingest`).

    Run ids the store already holds are refused (exit 2) before anything is written: runs are never
    merged or reused in place, so a second `amb generate` into one store needs another --seed or
    --prefix."""
    if seed + n_runs - 1 > MAX_SEED:
        raise UsageError(f"--seed {seed} with --runs {n_runs} goes past the largest seed, {MAX_SEED}")
    ids = [f"{prefix}-{seed + i:04d}" for i in range(n_runs)]
    for run_id in (ids[0], ids[-1]):
        if not ID_RE.match(run_id):
            raise UsageError(
                f"--prefix {for_message(prefix, 140)!r} makes the run id {for_message(run_id, 160)!r}: "
                "use 1-128 of letters, digits, '.', '_', ':', '-'"
            )
    way_out = "pick other ids with --seed or --prefix"
    for run_id in ids:  # all of them before the first is written
        require_free(store, run_id, way_out)
    tick = progress("generate")
    blobs = BlobStore(Path(store) / "blobs")  # in use throughout: the runs share one pack
    for i, run_id in enumerate(ids):
        tick(i, n_runs)
        generate_run(store, run_id, seed=seed + i, calls=calls, processes_per_call=processes_per_call)
    blobs.close()
    tick(n_runs, n_runs)
    click.echo(f"wrote {n_runs} synthetic runs into {store}/spool")


commands = [ingest, verify, generate]
