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


def assert_audit_scan_agrees(store: Path, runs: list[str]) -> None:
    """``amb scan audit`` over ``runs`` stores exactly the violations ``amb audit`` lists for each."""
    scanned = amb("scan", "audit", *runs, "--store", str(store), "--json")
    assert scanned.returncode == 0, scanned.stderr
    query = (
        "SELECT run_id, CAST(findings AS VARCHAR) AS f FROM scan_results_current "
        "WHERE scanner = 'audit' AND error IS NULL"
    )
    rows = amb("sql", "--store", str(store), "--format", "json", query)
    assert rows.returncode == 0, rows.stderr
    found = {r["run_id"]: json.loads(r["f"]) for r in json.loads(rows.stdout)}
    for run in runs:
        audit = amb("audit", "--store", str(store), run, "--json")
        assert audit.returncode == 0, audit.stderr
        want = [
            {"value": v["rule"], "explanation": v["detail"], "events": v["events"]}
            for v in json.loads(audit.stdout)["violations"]
        ]
        assert found[run] == want, (run, found[run], want)
