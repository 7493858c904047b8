"""Scoring commands: ``amb score``, ``amb report``, ``amb audit``."""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from amb.common import output_path, progress, store_option
from amb.judge_cmds import stability_text
from amb.output import cell, table
from replay.read import iter_events, require_runs
from replay.read import run_ids as all_run_ids
from replay.store import Store, open_sql
from schemas import score_row
from schemas.errors import BadInput, UsageError, quoted
from scorer import audit as auditor
from scorer import ledger, profile_diff, report_html
from scorer import report as reports
from scorer.batch import BatchResult, open_store, score_runs
from scorer.pipeline import audit_run
from scorer.profile import LoadedProfile
from scorer.profile import load as load_profile
from scorer.trajectory import fold

SHOW = ("s1", "s2", "s3", "s4", "s5", "agentic", "task_score", "overall")
JUDGE_NOTE = {"offline": "offline rule-based judge (no LLM); S1-S3 are rule verdicts"}


def _wrap(names: list[str], width: int = 58) -> list[str]:
    """Option names joined by commas, in pieces that fit a table cell (cells are cut at 60)."""
    lines = [""]
    for n in names:
        piece = n if not lines[-1] else f"{lines[-1]}, {n}"
        if len(piece) > width and lines[-1]:
            lines[-1] += ","
            lines.append(n)
        else:
            lines[-1] = piece
    return lines


def _fmt_exact(v: Any) -> str:
    """Like ``cell``, with enough digits that a rounding-only change shows."""
    return f"{v:.10g}" if isinstance(v, float) else cell(v)


def _no_scores(loaded: LoadedProfile, ref: str) -> UsageError:
    return UsageError(
        f"no scores under profile {loaded.name} ({loaded.short_id}) yet: "
        f"run `amb score --all --profile {ref}`"
    )


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
            note = (
                f"not scored under {other.name} with this judge (run amb score --profile {other_ref} first)"
            )
            out.append({"run_id": r["run_id"], "field": "*", "from": None, "to": None, "note": note})
            continue
        for f in SHOW + ("status", "medal", "rating"):
            floats = isinstance(a[f], float) and isinstance(r[f], float)
            if a[f] != r[f] and not (floats and abs(a[f] - r[f]) < 1e-12):
                delta = r[f] - a[f] if floats else None
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
    help=(
        "Rubric judge. Default: llm when an endpoint is configured (AMB_JUDGE_BASE_URL + AMB_JUDGE_MODEL "
        "or the profile), else offline."
    ),
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
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(1, 20),
    help="With --judge llm: ask every rubric item N times (each repeat cached and stored) "
    "and report the judge's stability.",
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
    repeat: int,
    as_json: bool,
) -> None:
    """Score RUNS (or --all) under a profile; rows are appended to the ledger, never overwritten."""
    if bool(runs) == all_runs:
        raise UsageError("give RUN ids or --all (not both)")
    if references is not None and not references.isprintable():
        # The ledger keeps the batch's arguments as text: a path it could not write back is refused.
        raise BadInput(f"--references {quoted(references)}: give a path of printable UTF-8 text")
    loaded = load_profile(profile)
    with open_store(store) as st:
        ids = None if all_runs else list(dict.fromkeys(runs))
        shown = _Shown(st.con, as_json, compare_ref)
        result = score_runs(
            st,
            loaded,
            run_ids=ids,
            judge=judge,
            references=Path(references) if references else None,
            jobs=jobs,
            progress=_score_progress(st, ids, repeat),
            args={
                "runs": list(runs),
                "all": all_runs,
                "judge": judge,
                "references": references,
                "jobs": jobs,
            },
            repeat=repeat,
            keep_rows=False,
            on_rows=shown.add,
        )
    if as_json:
        shown.echo_json(_score_json(loaded, result, shown.diffs, compare_ref))
        return
    kind = result.judge.split(":", 1)[0]
    note = f" ({JUDGE_NOTE[kind]})" if kind in JUDGE_NOTE else ""
    click.echo(
        f"profile: {loaded.name} ({loaded.short_id})  judge: {result.judge}{note}  judge requests: "
        f"{result.judge_requests}"
    )
    click.echo(table(SCORE_COLUMNS, shown.cells))
    if shown.unscored:
        click.echo(
            f"{shown.unscored} of {shown.count} runs have no OVERALL (unscored parts, see --json reasons)",
            err=True,
        )
    if result.stability is not None:
        click.echo(stability_text(result.stability, result.repeats))
    if shown.diffs is not None:
        click.echo(f"\nchanges against {compare_ref}: {len(shown.diffs)}")
        rows = [
            [d["run_id"], d["field"], cell(d["from"]), cell(d["to"]), d.get("note") or cell(d.get("delta"))]
            for d in shown.diffs
        ]
        if rows:
            click.echo(table(["run_id", "field", "from", "to", "delta"], rows))


class _Shown:
    """What ``amb score`` prints of a batch's rows, taken a chunk at a time as they are scored: the
    table's cells (or the rows' JSON, in a temporary file), the runs without an OVERALL and the
    changes against ``--compare``. The rows themselves are not kept, so memory does not grow with
    the store."""

    ROWS = '"rows": null'  # where the rows go in the JSON output

    def __init__(self, con: Any, as_json: bool, compare_ref: str | None):
        self.con, self.compare_ref = con, compare_ref
        self.cells: list[list[Any]] = []
        self.count = self.unscored = 0
        self.diffs: list[dict[str, Any]] | None = [] if compare_ref else None
        self.json = tempfile.TemporaryFile("w+", encoding="utf-8") if as_json else None

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.unscored += sum(1 for r in rows if r["overall"] is None)
        if self.diffs is not None and self.compare_ref:
            self.diffs += _compare(self.con, rows, self.compare_ref)
        for r in rows:
            if self.json is None:
                self.cells.append(_score_cells(r))
            else:
                self.json.write(",\n" if self.count else "\n")
                self.json.write(textwrap.indent(json.dumps(r, indent=2, default=str), "    "))
            self.count += 1

    def echo_json(self, out: dict[str, Any]) -> None:
        """``out`` as JSON, its ``rows`` those written to the file."""
        assert self.json is not None
        head, tail = json.dumps({**out, "rows": None}, indent=2, default=str).split(self.ROWS, 1)
        click.echo(head + '"rows": [', nl=False)
        self.json.seek(0)
        while block := self.json.read(1 << 20):
            click.echo(block, nl=False)
        click.echo(("\n  ]" if self.count else "]") + tail)
        self.json.close()


def _score_progress(st: Store, ids: list[str] | None, repeat: int) -> Callable[[int], None]:
    """Runs scored of the runs asked for, times the repeats."""
    total = (len(ids) if ids is not None else len(all_run_ids(st.con))) * repeat
    bar = progress("score")
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        bar(done[0], total or max(done[0], 1))

    return tick


def _score_json(
    loaded: LoadedProfile, result: BatchResult, diffs: list[dict[str, Any]] | None, compare_ref: str | None
) -> dict[str, Any]:
    out = {
        "batch_id": result.batch_id,
        "profile": {"name": loaded.name, "id": loaded.id},
        "judge": result.judge,
        "judge_requests": result.judge_requests,
        "rows": result.rows,
    }
    if diffs is not None:
        out["compare"] = {"against": compare_ref, "changes": diffs}
    if result.stability is not None:
        out["judge_requests"] = result.judge_requests + sum(r.judge_requests for r in result.repeats)
        out["stability"] = result.stability
    return out


SCORE_COLUMNS = (
    "run_id task tier S1 S2 S3 S4 S5 AGENTIC TASK OVERALL status medal rating codes cost_usd tokens".split()
)


def _score_cells(r: dict[str, Any]) -> list[Any]:
    """A scored row's cells under SCORE_COLUMNS."""
    return [
        r["run_id"],
        r["task"],
        r["tier"],
        *(cell(r[k]) for k in SHOW),
        r["status"],
        cell(r["medal"]),
        cell(r["rating"]),
        cell(r["codes"]),
        "unknown" if r["cost_usd"] is None else f"{r['cost_usd']:.6g}",
        # Tokens stand where a cost is unknown (a model missing from the price table).
        (r["tokens_in"] or 0) + (r["tokens_out"] or 0),
    ]


@click.command()
@store_option
@click.option(
    "--profile", default=None, help="Profile whose current rows are reported (default paper-2026-06)."
)
@click.option(
    "--judge",
    "judge_label",
    default=None,
    help=(
        "Only rows from this judge (e.g. offline:rules-v1 or llm:<model>); default: the judge with most rows."
    ),
)
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write a self-contained HTML page.",
)
@click.option(
    "--diff-profiles",
    "diff_profiles",
    nargs=2,
    default=None,
    metavar="A B",
    help="Per run, which options of profile B (against A) changed which numbers; both must be scored.",
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
    diff_profiles: tuple[str, str] | None,
    viewer_url: str,
    as_json: bool,
) -> None:
    """The paper's views (leaderboard, medals, tracks, tiers, stages, codes, recovery, cost); or, with
    --diff-profiles A B, which options changed which numbers between two profiles."""
    if html_file:
        output_path(html_file, "--html")
    if diff_profiles:
        _report_diff(store, diff_profiles, judge_label, as_json)
        return
    loaded = load_profile(profile)
    con = open_sql(store)
    try:
        counts = ledger.judge_counts(con, loaded.id)
        if not counts:
            raise _no_scores(loaded, profile or loaded.name)
        labels = sorted(counts)
        if judge_label is None:
            # Repeat rows (``<label>#r<i>``) measure a judge; the report shows the first asking.
            judge_label = max(labels, key=lambda j: ("#r" not in j, counts[j], j))
        elif judge_label not in labels:
            raise UsageError(f"no rows from judge {judge_label!r} (have: {', '.join(labels)})")
        repeats = sorted(
            (lab for lab in labels if lab.startswith(judge_label + "#r")),
            key=lambda lab: int(lab.rsplit("#r", 1)[1]),
        )
        data, rows = _views(con, loaded, judge_label, repeats, runs_listed=bool(html_file))
    finally:
        con.close()
    from amb.scan_cmds import scan_report, scan_report_text

    data.update(scan_report(store, loaded.id, judge_label, viewer_url))
    if html_file:
        Path(html_file).write_text(
            report_html.html_page(data, runs=rows, viewer_url=viewer_url or None), encoding="utf-8"
        )
    if as_json:
        click.echo(json.dumps({k: v for k, v in data.items() if k != "scatter"}, indent=2))
        return
    click.echo(reports.terminal(data, table))
    if data.get("judge_stability"):
        click.echo(stability_text(data["judge_stability"], []))
    if scans := scan_report_text(data):
        click.echo(scans)
    if html_file:
        click.echo(f"\nwrote {html_file}", err=True)


def _views(
    con: Any, loaded: LoadedProfile, judge: str, repeats: list[str], *, runs_listed: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The views of the judge's current rows, and the rows where the output lists every run (the
    page's table of runs; the judge's repeats, for its stability). Otherwise the rows are folded as
    they are read and none are kept, so memory does not grow with the number of runs. Only the
    judge's stability reads whole rows (their details are most of a row)."""
    if not repeats and not runs_listed:
        stream = ledger.stream(con, profile_id=loaded.id, judge=judge, columns=reports.COLUMNS)
        return reports.build(stream), []
    columns, labels = (score_row.COLUMNS if repeats else reports.COLUMNS), [judge, *repeats]
    by_label = {lab: ledger.current(con, profile_id=loaded.id, judge=lab, columns=columns) for lab in labels}
    rows = by_label[judge]
    data = reports.build(rows)
    if repeats:
        from scorer import judge_stability

        coders = list(by_label.values())
        data["judge_stability"] = {
            "repeats": len(coders),
            "judges": [judge, *repeats],
            **judge_stability.agreement_table(coders),
            "spread": judge_stability.spread(coders),
        }
    return data, rows


def _report_diff(store: str, refs: tuple[str, str], judge_label: str | None, as_json: bool) -> None:
    a, b = load_profile(refs[0]), load_profile(refs[1])
    rows_a, rows_b = ledger.current_rows(store, a, b)
    for ref, loaded, rows in ((refs[0], a, rows_a), (refs[1], b, rows_b)):
        if not rows:
            raise _no_scores(loaded, ref)
    if judge_label is None:
        labels = sorted({r["judge"] for r in rows_a} & {r["judge"] for r in rows_b})
        if not labels:
            raise UsageError("the two profiles share no judge: score both with the same --judge")
        judge_label = max(labels, key=lambda j: (sum(1 for r in rows_a if r["judge"] == j), j))
    data = profile_diff.diff_rows(
        a.profile,
        b.profile,
        [r for r in rows_a if r["judge"] == judge_label],
        [r for r in rows_b if r["judge"] == judge_label],
    )
    data = {"a": a.name, "b": b.name, "judge": judge_label, **data}
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    click.echo(
        f"{a.name} -> {b.name}, judge {judge_label}: {data['runs_compared']} runs compared, "
        f"{len(data['changes'])} changed numbers"
    )
    if data["runs_in_one_only"]:
        click.echo(f"scored under one profile only: {', '.join(data['runs_in_one_only'])}", err=True)
    cells = []
    for c in data["changes"]:
        first, *more = _wrap(c["options"])
        cells.append(
            [c["run_id"], c["track"] or "-", c["field"], _fmt_exact(c["a"]), _fmt_exact(c["b"]), first]
        )
        cells += [["", "", "", "", "", part] for part in more]
    if cells:
        click.echo(table(["run_id", "track", "field", a.name, b.name, "options"], cells))
    if data["runs_touched_by_option"]:
        click.echo("\nruns whose numbers each differing option feeds:")
        click.echo(
            table(["option", "runs"], [[k, str(v)] for k, v in data["runs_touched_by_option"].items()])
        )


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
        require_runs(st.con, [run], st.root)
        events = list(iter_events(st.con, run))
        traj = fold(run, events, st.blobs.get)
    finally:
        st.close()
    result = audit_run(traj, loaded.profile.audit)
    if as_json:
        click.echo(json.dumps({"run_id": run, "profile": loaded.name, **auditor.summary(result)}, indent=2))
        return
    click.echo(
        f"{run}: {result.status}" + (f" ({len(result.violations)} violations)" if result.violations else "")
    )
    if result.violations:
        rows = [[v.rule, v.detail, ", ".join(v.events)] for v in result.violations]
        click.echo(table(["rule", "detail", "events"], rows))
    sys.stdout.flush()


commands = [score, report, audit]
