"""``amb task``: list and show the benchmark's tasks, write synthetic twins, convert real datasets."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import click
import msgspec

from amb.output import emit
from schemas.errors import UsageError
from schemas.task_spec import TIERS, TaskSpec
from tasks import convert, synth
from tasks.registry import all_specs, brief, load_spec

LIST_COLUMNS = ["id", "track", "name", "modality", "cases", "metric", "time_limit_s", "converter"]


def _row(s: TaskSpec) -> list:
    return [s.id, s.track, s.name, s.modality, s.cases, s.metric.name, s.time_limit_s, s.converter or None]


@click.group()
def task() -> None:
    """The benchmark's tasks: specs, briefs, synthetic twins and dataset converters."""


@task.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(as_json: bool) -> None:
    """List every task."""
    emit(LIST_COLUMNS, [_row(s) for s in all_specs()], "json" if as_json else "table")


@task.command()
@click.argument("task_id")
@click.option("--tier", type=click.Choice(TIERS), help="Print this tier's brief instead of the spec.")
@click.option("--json", "as_json", is_flag=True, help="Print the spec as JSON.")
def show(task_id: str, tier: str | None, as_json: bool) -> None:
    """Show a task's spec (or, with --tier, the brief the agent gets)."""
    spec = load_spec(task_id)
    if tier:
        click.echo(brief(task_id, tier), nl=False)
        return
    if as_json:
        click.echo(json.dumps(msgspec.to_builtins(spec), indent=2))
        return
    sub = spec.submission
    lines = [
        f"{spec.id}: {spec.name} ({spec.track}, {spec.modality})",
        f"  dataset:    {spec.dataset}",
        f"  citation:   {spec.citation}",
        f"  cases:      {spec.cases}    time limit: {spec.time_limit_s} s",
        f"  public:     {', '.join(f'{spec.public.case_dir}/{f}' for f in spec.public.files)}",
        f"  submit:     {', '.join(f'{sub.root}/{f}' for f in sub.files)} ({sub.format}"
        + (f", {sub.dtype}" if sub.dtype else "")
        + (f", shape {sub.shape}" if sub.shape else "")
        + ")",
        f"  metric:     {spec.metric.name} {json.dumps(spec.metric.params)}",
        f"  forbidden:  {', '.join(spec.forbidden_paths)}",
        f"  converter:  {spec.converter or '-'}",
    ]
    if sub.label_ids:
        ids = sub.label_ids
        shown = ", ".join(map(str, ids[:25])) + (f", ... ({len(ids)} ids)" if len(ids) > 25 else "")
        lines.insert(6, f"  label ids:  {shown}")
    click.echo("\n".join(lines))


def _clear(out: Path, force: bool) -> None:
    existing = [out / side for side in ("public", "private") if (out / side).exists()]
    if existing and not force:
        raise UsageError(f"{existing[0]} already exists (use --force to replace public/ and private/)")
    for path in existing:
        shutil.rmtree(path)


out_option = click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder to write public/ and private/ into.",
)
force_option = click.option("--force", is_flag=True, help="Replace existing public/ and private/ folders.")


@task.command("synth")
@click.argument("task_id")
@out_option
@click.option(
    "--cases", type=click.IntRange(min=1), default=None, help=f"Case count (default {synth.DEFAULT_CASES})."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed (same seed, same bytes).")
@force_option
def synth_cmd(task_id: str, out: str, cases: int | None, seed: int, force: bool) -> None:
    """Write a task's synthetic twin (public inputs and private references) into --out."""
    spec = load_spec(task_id)
    out_dir = Path(out)
    _clear(out_dir, force)
    synth.synth(spec, out_dir, cases, seed)
    n = cases or synth.DEFAULT_CASES
    click.echo(f"wrote {n} synthetic {spec.id} cases (seed {seed}) to {out_dir}/public and {out_dir}/private")


@task.command()
@click.argument("task_id")
@click.option("--source", required=True, type=click.Path(file_okay=False), help="The dataset as distributed.")
@out_option
@force_option
def prepare(task_id: str, source: str, out: str, force: bool) -> None:
    """Convert a real public dataset into the task's layout."""
    spec = load_spec(task_id)
    out_dir = Path(out)
    _clear(out_dir, force)
    done: list[str] = []

    def progress(case: str) -> None:
        done.append(case)
        if sys.stderr.isatty():
            click.echo(f"\r{spec.id}: {len(done)} cases converted (last {case})", nl=False, err=True)

    convert.prepare(spec, Path(source), out_dir, progress=progress)
    if sys.stderr.isatty() and done:
        click.echo("", err=True)
    click.echo(f"prepared {len(done)} {spec.id} cases from {source} into {out_dir}")


commands = [task]
