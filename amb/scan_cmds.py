"""``amb scan`` (your own checks over stored runs) and ``amb labels`` (a person's labels, and how far a
scanner or a judge agrees with them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from amb.common import progress, store_option
from amb.output import table
from replay.read import require_runs
from replay.store import open_sql
from schemas.display import one_line
from schemas.errors import UsageError
from scorer import labels as lab
from scorer import ledger, scan_results, scanners
from scorer import scan as scanning
from scorer.batch import open_store
from scorer.judge.llm import endpoint
from scorer.profile import load as load_profile

VIEWER = click.option(
    "--viewer-url",
    default="http://127.0.0.1:8765",
    show_default=True,
    envvar="AMB_VIEWER_URL",
    help="Base URL of `amb serve`: each disagreeing run links there.",
)

TALLIES = ("scanned", "skipped", "flagged", "errors")


def _is_scanner(arg: str) -> bool:
    return arg == "audit" or arg.split(":", 1)[0].lower().endswith((".py", ".sql", ".toml"))


def _f(v: Any) -> str:
    return "—" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def validation_text(results: list[dict[str, Any]]) -> str:
    cols = [*"target runs agreement kappa alpha precision recall F1".split(), "kappa 95%", "disagree"]
    rows = []
    for r in results:
        ci = r["intervals"].get("kappa")
        rows.append(
            [r["target"], str(r["runs"])]
            + [_f(r.get(k)) for k in ("agreement", "kappa", "alpha", "precision", "recall", "f1")]
            + ["—" if not ci else f"{ci[0]:.2f}..{ci[1]:.2f}", str(len(r["disagreements"]))]
        )
    lines = [table(cols, rows)]
    for r in results:
        for d in r["disagreements"][:20]:
            said = f"label {d['label']!r}, got {d['predicted']!r}"
            lines.append(one_line(f"  {r['target']} {d['run_id']}: {said}  {d['link']}"))
    return "\n".join(lines)


@click.command()
@store_option
@click.argument("args", nargs=-1, metavar="SCANNER... [RUNS...]")
@click.option("--all", "all_runs", is_flag=True, help="Scan every run in the store.")
@click.option("--where", default=None, help="Scan the runs of the `runs` view matching this SQL condition.")
@click.option("--jobs", "-j", default=2, show_default=True, type=click.IntRange(1, 64), help="Runs at once.")
@click.option("--fail-on-error", is_flag=True, help="Stop at the first run a scanner fails on.")
@click.option("--retry-errors", is_flag=True, help="Scan again the runs a scanner version failed on.")
@click.option(
    "--errors", "list_errors", is_flag=True, help="List the runs whose latest scan failed, and stop."
)
@click.option(
    "--validate", "label_set", default=None, help="Also validate each scanner against this label set."
)
@click.option(
    "--profile", default=None, help="Profile of the audit rules and the evidence (default paper-2026-06)."
)
@VIEWER
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def scan(
    store: str,
    args: tuple[str, ...],
    all_runs: bool,
    where: str | None,
    jobs: int,
    fail_on_error: bool,
    retry_errors: bool,
    list_errors: bool,
    label_set: str | None,
    profile: str | None,
    viewer_url: str,
    as_json: bool,
) -> None:
    """Run SCANNERs (file.py[:name], file.sql, file.toml, or audit) over RUNS, --all or --where;
    results are appended to the store (a run already scanned by a scanner version is skipped)."""
    if list_errors:
        _print_errors(store, as_json)
        return
    specs = [a for a in args if _is_scanner(a)]
    runs = [a for a in args if not _is_scanner(a)]
    if not specs:
        raise UsageError("give at least one SCANNER (a .py, .sql or .toml file, or audit)")
    if sum((bool(runs), all_runs, where is not None)) != 1:
        raise UsageError("give RUN ids, --all or --where SQL (one of them)")
    _require_label_set(store, label_set)
    loaded = load_profile(profile)
    model = ep[2] if (ep := endpoint(loaded.profile.judge)) else None
    found = [s for spec in specs for s in scanners.load(spec, model=model, audit_rules=loaded.profile.audit)]
    bar = progress("scan")
    scan_id, tallies, requests = scanning.scan(
        store,
        loaded,
        found,
        runs=runs or None,
        where=where,
        jobs=jobs,
        fail_on_error=fail_on_error,
        retry_errors=retry_errors,
        progress=bar,
    )
    validation = None
    if label_set:
        con = open_sql(store)
        try:
            validation = [
                v for t in tallies for v in lab.validate_scanner(con, label_set, t.scanner.name, viewer_url)
            ]
        finally:
            con.close()
    if as_json:
        out = {
            "scan_id": scan_id,
            "model_requests": requests,
            "scanners": [
                {"name": t.scanner.name, "id": t.scanner.id, "kind": t.scanner.kind}
                | {k: getattr(t, k) for k in TALLIES}
                for t in tallies
            ],
        }
        click.echo(json.dumps(out | ({"validation": validation} if validation is not None else {}), indent=2))
        return
    rows = [
        [t.scanner.name, t.scanner.short_id, t.scanner.kind, *(str(getattr(t, k)) for k in TALLIES)]
        for t in tallies
    ]
    click.echo(table(["scanner", "version", "kind", *TALLIES], rows))
    click.echo(f"scan {scan_id}: model requests {requests}")
    if any(t.errors for t in tallies):
        click.echo("some runs failed a scanner: see `amb scan --errors`", err=True)
    if validation is not None:
        click.echo(f"\nagainst labels {label_set}:\n" + validation_text(validation))


def _tables(con: Any) -> set[str]:
    return {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def _scanned(store: str) -> Any:
    """The store's read-only connection, once its scan tables exist (else one line saying what to do)."""
    con = open_sql(store)
    if "scan_results" not in _tables(con):
        con.close()
        raise UsageError("nothing in this store has been scanned or labelled yet: run `amb scan` first")
    return con


def _require_label_set(store: str, name: str | None) -> None:
    """One line, before any scanning, when a label set is named and the store holds none of it."""
    if name is None:
        return
    con = open_sql(store)
    try:
        if "labels" not in _tables(con) or not lab.current(con, name):
            raise UsageError(f"no label set {name!r} in this store: import one with `amb labels import`")
    finally:
        con.close()


def _print_errors(store: str, as_json: bool) -> None:
    con = _scanned(store)
    try:
        rows = scan_results.errors(con)
    finally:
        con.close()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    cells = [
        [r["scanner"], r["scanner_id"].removeprefix("sha256:")[:12], r["run_id"], r["error"]] for r in rows
    ]
    click.echo(table(["scanner", "version", "run_id", "error"], cells))


def scan_report(store: str, profile_id: str, judge: str, viewer_url: str) -> dict[str, Any]:
    """``amb report``'s scan part: each scanner's share of the judge's scored runs flagged per model
    and track, and each label set's validation of the judge (empty when the store has neither). The
    shares fold the runs as they are read; the validation reads the labelled runs' rows."""
    con = open_sql(store)
    try:
        if "scan_results" not in _tables(con):
            return {}
        sets = [s for (s,) in con.execute("SELECT DISTINCT label_set FROM labels ORDER BY 1").fetchall()]
        checks = {}
        for name in sets:
            labels = lab.current(con, name)
            labelled = sorted({run for runs in labels.values() for run in runs})
            rows = ledger.current(con, profile_id=profile_id, judge=judge, run_ids=labelled)
            checks[name] = lab.validate_judge(rows, labels, viewer_url)
        runs = ledger.stream(con, profile_id=profile_id, judge=judge, columns=("run_id", "model", "track"))
        return {"scanners": scan_results.shares(con, runs), "judge_validation": checks}
    finally:
        con.close()


def scan_report_text(data: dict[str, Any]) -> str:
    out = []
    if data.get("scanners"):
        cols = ["scanner", "by", "group", "runs", "flagged", "share", "unscanned"]
        cells = [[str(s[c]) if c != "share" else _f(s[c]) for c in cols] for s in data["scanners"]]
        out.append("\nscanners: share of runs flagged\n" + table(cols, cells))
    for name, results in (data.get("judge_validation") or {}).items():
        if results:
            out.append(f"\njudge against labels {name}:\n" + validation_text(results))
    return "\n".join(out)


@click.group()
def labels() -> None:
    """A person's labels (append-only), and validation of scanners and judges against them."""


@labels.command("import")
@store_option
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="The label set's name.")
def labels_import(store: str, file: str, name: str) -> None:
    """Import FILE (CSV, JSONL or YAML: run_id, target, value, annotator) as label set NAME."""
    records, digest = lab.read(Path(file))
    with open_store(store) as st:
        require_runs(st.con, [r["run_id"] for r in records], st.root)
        lab.require_one_kind(st.con, name, records)
        lab.append(st.con, name, records, digest)
    click.echo(f"imported {len(records)} labels into {name}")


@labels.command("validate")
@store_option
@click.argument("name")
@click.option("--scanner", "scanner_name", default=None, help="Validate this scanner's current values.")
@click.option("--judge", "judge_label", default=None, help="Validate this judge's codes and rubric items.")
@click.option(
    "--profile", default=None, help="Profile whose score rows --judge reads (default paper-2026-06)."
)
@VIEWER
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def labels_validate(store: str, name: str, **o: Any) -> None:
    """Agreement, precision, recall, F1, kappa, alpha, confusion and intervals against label set NAME."""
    scanner_name, judge_label, viewer_url = o["scanner_name"], o["judge_label"], o["viewer_url"]
    if (scanner_name is None) == (judge_label is None):
        raise UsageError("give --scanner S or --judge LABEL (one of them)")
    con = _scanned(store)
    try:
        have = lab.current(con, name)
        if not have:
            raise UsageError(f"no label set {name!r} in this store: import one with `amb labels import`")
        if scanner_name:
            _require_scanner_labels(con, name, have, scanner_name)
            results = lab.validate_scanner(con, name, scanner_name, viewer_url)
        else:
            if not any(t == "codes" or t.startswith("item:") for t in have):
                raise UsageError(
                    f"label set {name!r} labels no codes or item:<id> to validate a judge against"
                )
            rows = [
                r
                for r in ledger.current(con, profile_id=load_profile(o["profile"]).id)
                if r["judge"] == judge_label
            ]
            if not rows:
                raise UsageError(f"no current score rows from judge {judge_label!r}: run `amb score` first")
            results = lab.validate_judge(rows, have, viewer_url)
    finally:
        con.close()
    if o["as_json"]:
        click.echo(json.dumps({"labels": name, "results": results}, indent=2))
        return
    click.echo(validation_text(results))


def _require_scanner_labels(con: Any, name: str, have: dict[str, Any], scanner_name: str) -> None:
    """One line saying why scanner ``scanner_name`` cannot be validated against label set ``name``:
    the set labels nothing of it, or it has no results in the store."""
    if f"scanner:{scanner_name}" not in have:
        labelled = sorted(t.removeprefix("scanner:") for t in have if t.startswith("scanner:"))
        raise UsageError(
            f"label set {name!r} has no scanner:{scanner_name} labels "
            f"(it labels the scanners: {', '.join(labelled) or 'none'})"
        )
    if not lab.scanner_values(con, scanner_name, as_flag=False):
        raise UsageError(
            f"scanner {scanner_name!r} has no results in this store (or failed on every run): run `amb scan`"
        )


commands = [scan, labels]
