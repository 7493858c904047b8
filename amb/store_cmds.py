"""Commands that write or check the event store: ingest, verify, generate (the ones that only read it
are in ``amb.query_cmds``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from amb.common import progress, say_error, store_option, stored_only
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
        from amb.shard_ingest import ingest_from

        sys.exit(ingest_from(store, [Path(s) for s in sources], as_json=as_json, spool_mode=spools))
    _check_ingest_input(store, runs)
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


def _check_ingest_input(store: str, runs: tuple[str, ...]) -> None:
    """Something to ingest, or a store already there: a mistyped --store is not made a new, empty
    store, and a RUN with neither spools nor events is not found."""
    root = resolve(store)
    if not (root / DB_NAME).exists() and not (root / "spool").is_dir():
        raise NotFound(f"no store and no spools at {root}: nothing to ingest (check --store or AMB_STORE)")
    stored_only(store, runs)


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


def _count_option(name: str, default: int, low: int, high: int | None, help_text: str) -> Any:
    return click.option(
        name, default=default, show_default=True, type=click.IntRange(low, high), help=help_text
    )


@click.command()
@store_option
@click.option(
    "--runs", "n_runs", default=5, show_default=True, type=click.IntRange(min=1), help="How many runs."
)
@_count_option(
    "--calls",
    35,
    1,
    MAX_CALLS,
    "Model calls per run (each request carries the whole conversation so far: it grows as calls²).",
)
@_count_option(
    "--seed", 0, 0, MAX_SEED, "Seed of the first run (run i uses seed+i; it also sets the run's clock)."
)
@click.option("--prefix", default="synth", show_default=True, help="Run id prefix (ids are PREFIX-SEED).")
@click.option(
    "--processes-per-call",
    default=1,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Processes the shim sees per tool call (a big run without a quadratic conversation).",
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
