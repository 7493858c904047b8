"""Red team, local backend (``amb-record --shim``): where the agent is not isolated, it is audited.

Locally the agent runs as the user, with the user's files: reading the private data or another
run's spool is not blocked (docs/containers.md says so). What this checks is that each attempt is
recorded by the shim and listed by ``amb audit`` with the process event that did it, however the
path was spelled. The attack script is a file, so nothing is found in the recorded command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

from tests.scan_checks import assert_audit_scan_agrees

BIN = Path(sys.executable).parent

SCRIPT = r"""
touch "$(printf 'blind\377')" && mkdir "$(printf 'blind\376')"  # names that are not UTF-8, first
private="$AMB_DATA/../private/case_00000/organ.nii.gz"
cat "$private" > stolen.txt
bash -c "cat '$(dirname "$AMB_DATA")/pri''vate/case_00000/organ.nii.gz'" > /dev/null
ln -s "$AMB_DATA/../private" priv && cat priv/case_00000/organ.nii.gz > /dev/null
cd "$AMB_DATA/.." && cat private/case_00000/organ.nii.gz > /dev/null && cd - > /dev/null
cat "$OTHER_STORE/spool/20261130T090000-bbbbbb/shim.spool" > /dev/null
exit 0
"""

EXPECTED = [
    ("private_access", "cat", "/data/public/../private/case_00000/organ.nii.gz"),
    ("private_access", "bash", "pri''vate"),
    ("private_access", "ln", "-s"),
    ("private_access", "cat", "private/case_00000/organ.nii.gz"),
    ("other_runs", "cat", "shim.spool"),
    ("recorder_access", "cat", "shim.spool"),
]


def test_local_attacks_are_recorded_and_audited(tmp_path):
    store, work, data = tmp_path / "store", tmp_path / "work", tmp_path / "data"
    work.mkdir()
    (data / "public" / "case_00000").mkdir(parents=True)
    (data / "private" / "case_00000").mkdir(parents=True)
    (data / "private" / "case_00000" / "organ.nii.gz").write_bytes(b"PRIVATE-REFERENCE")
    other = tmp_path / "other" / "amb-store"
    (other / "spool" / "20261130T090000-bbbbbb").mkdir(parents=True)
    (other / "spool" / "20261130T090000-bbbbbb" / "shim.spool").write_text("another run\n")
    script = tmp_path / "hostile.sh"
    script.write_text(SCRIPT)
    run = "20261201T120000-cccccc"
    argv = [str(BIN / "amb-record"), "--store", str(store), "--run-id", run, "--shim"]
    argv += ["--task", "kidney-seg", "--data", str(data), "--", "bash", str(script)]
    env = {"PATH": "/usr/bin:/bin", "OTHER_STORE": str(other), "HOME": str(tmp_path)}
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (work / "stolen.txt").read_bytes() == b"PRIVATE-REFERENCE"  # not blocked locally...
    audit = subprocess.run(
        [str(BIN / "amb"), "audit", "--store", str(store), run, "--json"], capture_output=True, text=True
    )
    assert audit.returncode == 0, audit.stderr
    violations = json.loads(audit.stdout)["violations"]
    assert_audit_scan_agrees(store, [run])  # the built-in audit scanner finds the same
    con = duckdb.connect(str(store / "amb.duckdb"), read_only=True)
    procs = con.execute(
        "SELECT source || ':' || seq, payload FROM events WHERE run_id = ? AND kind = 'process.exited'", [run]
    ).fetchall()
    for rule, prog, needle in EXPECTED:  # ...but every attempt is audited, citing its process
        showing = {
            e
            for e, p in procs
            if (argv_ := json.loads(p)["argv"]) and Path(argv_[0]).name == prog and needle in " ".join(argv_)
        }
        assert showing, (rule, prog, needle, [json.loads(p)["argv"] for _, p in procs])
        cited = {e for v in violations if v["rule"] == rule for e in v["events"]}
        assert showing & cited, (rule, prog, needle, violations)
