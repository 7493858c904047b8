"""The grade command, shared by ``amb grade`` and ``python -m scorer.grader``: the grader image
carries only ``schemas``, ``scorer`` and ``tasks`` (no ``amb``), so the command lives here."""

from __future__ import annotations

import json
from pathlib import Path

import click
import msgspec

from schemas.display import one_line, table
from scorer.grader import grade as grade_submission
from scorer.profile import load_options
from tasks.registry import load_spec


@click.command()
@click.argument("task_id")
@click.option(
    "--submission", required=True, type=click.Path(), help="The agent's workspace (holds agents_outputs/)."
)
@click.option("--reference", required=True, type=click.Path(), help="The data set's private/ folder.")
@click.option(
    "--profile", default=None, help="Scoring profile: a built-in name or a TOML file with a [metrics] table."
)
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
def grade(task_id: str, submission: str, reference: str, profile: str | None, as_json: bool) -> None:
    """Grade a submission for TASK_ID: per-case scores with reasons, and the TASK score."""
    spec = load_spec(task_id)
    options, profile_name = load_options(profile, spec.track)
    result = grade_submission(spec, Path(submission), Path(reference), options)
    if as_json:
        data = msgspec.to_builtins(result)
        data["profile"] = profile_name
        click.echo(json.dumps(data, indent=2))
        return
    rows = [[c.case, f"{c.score:.4g}", c.status, c.reason or ""] for c in result.cases]
    click.echo(table(["case", "score", "status", "reason"], rows, width=None))
    checks = result.checks
    click.echo(
        f"\n{result.task}: {result.metric} = {result.score:.4f}  "
        f"({checks.get('n_scored', '?')}/{checks.get('n_cases', '?')} cases scored, "
        f"gate {checks.get('gate', options.completeness)}, profile {profile_name})"
    )
    if result.degraded:
        # A note may quote an exception about the agent's text: nothing a terminal would obey.
        click.echo(f"degraded: {one_line('; '.join(result.degraded))}")
