"""``amb gc``: remove what runs whose recorder was killed left behind (containers, networks,
host firewall rules, temp dirs); live runs are never touched (``recorder.gc``)."""

from __future__ import annotations

import json

import click

from amb.output import emit


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gc(as_json: bool) -> None:
    """Remove the leftovers of runs whose amb-record is gone, and say what was removed."""
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


commands = [gc]
