"""Shared by the scan tests: the scanners of docs/scanning.md as files, and the check that the built-in
audit scanner finds what ``amb audit`` finds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

AMB = str(Path(sys.executable).parent / "amb")
DOC = Path(__file__).parents[1] / "docs" / "scanning.md"


def doc_scanners(folder: Path) -> list[Path]:
    """Every ``<!-- scanner: NAME -->`` code block of docs/scanning.md, written to ``folder/NAME``."""
    out = []
    for name, body in re.findall(r"<!-- scanner: (\S+) -->\n```\w+\n(.*?)```", DOC.read_text(), re.S):
        path = folder / name
        path.write_text(body)
        out.append(path)
    return out


def amb(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AMB, *args], capture_output=True, text=True, timeout=600, env=env)


def _json_rows(store: Path, query: str) -> list[dict]:
    rows = amb("sql", "--store", str(store), "--format", "json", query)
    assert rows.returncode == 0, rows.stderr
    return json.loads(rows.stdout)


def assert_audit_scan_agrees(store: Path, runs: list[str]) -> None:
    """The audit is one mechanism: ``amb scan audit`` over ``runs`` stores exactly the violations
    ``amb audit`` lists for each, ``amb score`` (offline judge; the runs are scored here when they
    are not yet) found the same, and every audit row, whoever wrote it, is one scanner version."""
    scanned = amb("scan", "audit", *runs, "--store", str(store), "--json")
    assert scanned.returncode == 0, scanned.stderr
    [audit_scanner] = json.loads(scanned.stdout)["scanners"]
    scored = {r["run_id"] for r in _json_rows(store, "SELECT DISTINCT run_id FROM scores")}
    if missing := [r for r in runs if r not in scored]:
        done = amb("score", *missing, "--judge", "offline", "--store", str(store))
        assert done.returncode == 0, done.stderr
    found = {
        r["run_id"]: (r["scanner_id"], json.loads(r["f"]))
        for r in _json_rows(
            store,
            "SELECT run_id, scanner_id, CAST(findings AS VARCHAR) AS f FROM scan_results_current "
            "WHERE scanner = 'audit' AND error IS NULL",
        )
    }
    by_scoring = {
        r["run_id"]: json.loads(r["v"])
        for r in _json_rows(
            store, "SELECT run_id, CAST(details->'violations' AS VARCHAR) AS v FROM scores_current"
        )
    }
    for run in runs:
        audit = amb("audit", "--store", str(store), run, "--json")
        assert audit.returncode == 0, audit.stderr
        violations = json.loads(audit.stdout)["violations"]
        want = [{"value": v["rule"], "explanation": v["detail"], "events": v["events"]} for v in violations]
        assert found[run] == (audit_scanner["id"], want), (run, found[run], want)
        assert by_scoring[run] == violations, (run, by_scoring[run], violations)
