"""Scoring commands: ``amb score``, ``amb report``, ``amb audit``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from amb.common import progress, store_option
from amb.output import table
from replay.read import iter_events
from replay.store import Store, open_sql
from schemas.errors import UsageError
from scorer import audit as auditor
from scorer import ledger
from scorer import report as reports
from scorer.batch import open_store, score_runs
from scorer.pipeline import task_info
from scorer.profile import load as load_profile
from scorer.trajectory import fold

SHOW = ("s1", "s2", "s3", "s4", "s5", "agentic", "task_score", "overall")
JUDGE_NOTE = {"offline": "offline rule-based judge (no LLM); S1-S3 are rule verdicts"}


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list):
        return ",".join(v) or "-"
    return str(v)


def _judge_line(label: str) -> str:
    kind = label.split(":", 1)[0]
    return f"judge: {label}" + (f" ({JUDGE_NOTE[kind]})" if kind in JUDGE_NOTE else "")


def _compare(con, rows: list[dict[str, Any]], other_ref: str) -> list[dict[str, Any]]:
    other = load_profile(other_ref)
    if not rows:
        return []
    base = {
        r["run_id"]: r
        for r in ledger.current(
            con, profile_id=other.id, judge=rows[0]["judge"], run_ids=[r["run_id"] for r in rows]
        )
    }
    out = []
    for r in rows:
        a = base.get(r["run_id"])
        if a is None:
            out.append(
                {
                    "run_id": r["run_id"],
                    "field": "*",
                    "from": None,
                    "to": None,
                    "note": f"not scored under {other.name} with this judge (run amb score --profile {other_ref} first)",
                }
            )
            continue
        for f in SHOW + ("status",):
            if a[f] != r[f] and not (
                isinstance(a[f], float) and isinstance(r[f], float) and abs(a[f] - r[f]) < 1e-12
            ):
                delta = (r[f] - a[f]) if isinstance(a[f], float) and isinstance(r[f], float) else None
                out.append({"run_id": r["run_id"], "field": f, "from": a[f], "to": r[f], "delta": delta})
        if sorted(a["codes"] or []) != sorted(r["codes"] or []):
            out.append(
                {"run_id": r["run_id"], "field": "codes", "from": a["codes"], "to": r["codes"], "delta": None}
            )
    return out


@click.command()
@store_option
@click.argument("runs", nargs=-1)
@click.option("--all", "all_runs", is_flag=True, help="Score every run in the store.")
@click.option(
    "--profile", default=None, help="Scoring profile: a built-in name (default paper-2026-06) or a TOML path."
)
@click.option(
    "--judge",
    type=click.Choice(["offline", "llm"]),
    default=None,
    help="Rubric judge. Default: llm when an endpoint is configured (AMB_JUDGE_BASE_URL + AMB_JUDGE_MODEL or the profile), else offline.",
)
@click.option(
    "--references",
    envvar="AMB_REFERENCES",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder with <task-id>/private references for TASK scores. Env: AMB_REFERENCES.",
)
@click.option(
    "--jobs", "-j", default=2, show_default=True, type=click.IntRange(1, 64), help="Runs scored in parallel."
)
@click.option(
    "--compare", "compare_ref", default=None, help="Show what changed against the current rows of profile A."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def score(
    store: str,
    runs: tuple[str, ...],
    all_runs: bool,
    profile: str | None,
    judge: str | None,
    references: str | None,
    jobs: int,
    compare_ref: str | None,
    as_json: bool,
) -> None:
    """Score RUNS (or --all) under a profile; rows are appended to the ledger, never overwritten."""
    if bool(runs) == all_runs:
        raise UsageError("give RUN ids or --all (not both)")
    loaded = load_profile(profile)
    with open_store(store) as st:
        ids = None if all_runs else list(dict.fromkeys(runs))
        total = len(ids) if ids is not None else None
        bar = progress("score")
        done = [0]

        def tick(n: int) -> None:
            done[0] += n
            bar(done[0], total or max(done[0], 1))

        if total is None:
            from replay.read import run_ids

            total = len(run_ids(st.con))
        result = score_runs(
            st,
            loaded,
            run_ids=ids,
            judge=judge,
            references=Path(references) if references else None,
            jobs=jobs,
            progress=tick,
            args={
                "runs": list(runs),
                "all": all_runs,
                "judge": judge,
                "references": references,
                "jobs": jobs,
            },
        )
        diffs = _compare(st.con, result.rows, compare_ref) if compare_ref else None
    if as_json:
        out = {
            "batch_id": result.batch_id,
            "profile": {"name": loaded.name, "id": loaded.id},
            "judge": result.judge,
            "judge_requests": result.judge_requests,
            "rows": result.rows,
        }
        if diffs is not None:
            out["compare"] = {"against": compare_ref, "changes": diffs}
        click.echo(json.dumps(out, indent=2, default=str))
        return
    click.echo(
        f"profile: {loaded.name} ({loaded.short_id})  {_judge_line(result.judge)}  judge requests: {result.judge_requests}"
    )
    cols = [
        "run_id",
        "task",
        "tier",
        "S1",
        "S2",
        "S3",
        "S4",
        "S5",
        "AGENTIC",
        "TASK",
        "OVERALL",
        "status",
        "codes",
        "cost_usd",
    ]
    click.echo(
        table(
            cols,
            [
                [
                    r["run_id"],
                    r["task"],
                    r["tier"],
                    *(_fmt(r[k]) for k in SHOW),
                    r["status"],
                    _fmt(r["codes"]),
                    _fmt(r["cost_usd"]),
                ]
                for r in result.rows
            ],
        )
    )
    unscored = sum(1 for r in result.rows if r["overall"] is None)
    if unscored:
        click.echo(
            f"{unscored} of {len(result.rows)} runs have no OVERALL (unscored parts, see --json reasons)",
            err=True,
        )
    if diffs is not None:
        click.echo(f"\nchanges against {compare_ref}: {len(diffs)}")
        if diffs:
            click.echo(
                table(
                    ["run_id", "field", "from", "to", "delta"],
                    [
                        [
                            d["run_id"],
                            d["field"],
                            _fmt(d["from"]),
                            _fmt(d["to"]),
                            d.get("note") or _fmt(d.get("delta")),
                        ]
                        for d in diffs
                    ],
                )
            )


@click.command()
@store_option
@click.option(
    "--profile", default=None, help="Profile whose current rows are reported (default paper-2026-06)."
)
@click.option(
    "--judge",
    "judge_label",
    default=None,
    help="Only rows from this judge (e.g. offline:rules-v1 or llm:<model>); default: the judge with most rows.",
)
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write a self-contained HTML page.",
)
@click.option(
    "--viewer-url",
    default="http://127.0.0.1:8765",
    show_default=True,
    envvar="AMB_VIEWER_URL",
    help="Base URL of `amb serve`: the HTML page links each run there ('' for no links).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def report(
    store: str,
    profile: str | None,
    judge_label: str | None,
    html_file: str | None,
    viewer_url: str,
    as_json: bool,
) -> None:
    """The paper's views (leaderboard, tracks, tiers, stages, codes, recovery, cost) over the ledger."""
    loaded = load_profile(profile)
    con = open_sql(store)
    try:
        exists = con.execute(
            "SELECT count(*) FROM duckdb_views() WHERE view_name = 'scores_current'"
        ).fetchone()[0]
        if not exists:
            raise UsageError("no scores in this store yet: run `amb score --all` first")
        rows = ledger.current(con, profile_id=loaded.id)
    finally:
        con.close()
    if not rows:
        raise UsageError(
            f"no scores under profile {loaded.name} ({loaded.short_id}) yet: run `amb score --all --profile {profile or loaded.name}`"
        )
    labels = sorted({r["judge"] for r in rows})
    if judge_label is None:
        judge_label = max(labels, key=lambda j: (sum(1 for r in rows if r["judge"] == j), j))
    elif judge_label not in labels:
        raise UsageError(f"no rows from judge {judge_label!r} (have: {', '.join(labels)})")
    rows = [r for r in rows if r["judge"] == judge_label]
    data = reports.build(rows)
    if html_file:
        Path(html_file).write_text(
            reports.html_page(data, runs=rows, viewer_url=viewer_url or None), encoding="utf-8"
        )
    if as_json:
        click.echo(json.dumps({k: v for k, v in data.items() if k != "scatter"}, indent=2))
        return
    click.echo(reports.terminal(data, table))
    if html_file:
        click.echo(f"\nwrote {html_file}", err=True)


@click.command()
@store_option
@click.argument("run")
@click.option("--profile", default=None, help="Profile whose [audit] rules apply (default paper-2026-06).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def audit(store: str, run: str, profile: str | None, as_json: bool) -> None:
    """Rule violations in RUN's events, each with the events that show it."""
    loaded = load_profile(profile)
    st = Store.open(store, read_only=True)
    try:
        events = list(iter_events(st.con, run))
        traj = fold(run, events, st.blobs.get)
    finally:
        st.close()
    if not events:
        raise UsageError(f"no run {run!r} in the store (see `amb runs`)")
    _, forbidden = task_info(traj.task)
    result = auditor.audit(traj, loaded.profile.audit, list(forbidden))
    if as_json:
        click.echo(json.dumps({"run_id": run, "profile": loaded.name, **auditor.summary(result)}, indent=2))
        return
    click.echo(
        f"{run}: {result.status}" + (f" ({len(result.violations)} violations)" if result.violations else "")
    )
    if result.violations:
        click.echo(
            table(
                ["rule", "detail", "events"],
                [[v.rule, v.detail, ", ".join(v.events)] for v in result.violations],
            )
        )
    sys.stdout.flush()


commands = [score, report, audit]
