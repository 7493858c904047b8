"""The commands that only read the store (``amb runs``, ``show``, ``sql``, ``manifest``, ``schema``,
and ``amb report``) start without importing Arrow or numpy: what they do needs neither, and the two
cost about a third of a second of every call. The commands themselves are tested in
tests/amb/test_store_cmds.py and tests/amb/test_score_cmds.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.amb.test_store_cmds import amb

RUNS_ONE = """
import sys
from amb.main import cli

try:
    cli(sys.argv[1:], prog_name="amb")
    code = 0
except SystemExit as e:
    code = e.code
heavy = [m for m in ("numpy", "pyarrow") if m in sys.modules]
print("heavy: " + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    store = tmp_path_factory.mktemp("query") / "store"
    amb("generate", "--runs", "1", "--calls", "3", store=store)
    amb("ingest", store=store)
    amb("score", "--all", store=store)
    (row,) = json.loads(amb("runs", "--json", store=store).stdout)
    return store, row["run_id"]


@pytest.mark.parametrize(
    "args",
    [
        ["runs"],
        ["show", "{run}"],
        ["sql", "SELECT count(*) FROM runs"],
        ["manifest", "{run}"],
        ["schema", "--format", "ddl"],
        ["report"],
    ],
    ids=lambda a: a[0],
)
def test_a_command_that_only_reads_imports_neither_arrow_nor_numpy(scored, args):
    store, run = scored
    argv = [a.format(run=run) for a in args]
    proc = subprocess.run(
        [sys.executable, "-c", RUNS_ONE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"AMB_STORE": str(store)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), proc.stderr  # it did its work
    assert proc.stderr.splitlines()[-1] == "heavy: ", proc.stderr
