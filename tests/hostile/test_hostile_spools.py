"""A spool that is a FIFO or a device (or a link to one) in a folder others can write: `amb watch`
names it and goes on, never an open or a read that blocks or never ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("kind", ["fifo", "endless"])
def test_watch_names_a_spool_that_is_no_regular_file(tmp_path: Path, kind: str) -> None:
    spool = tmp_path / "store" / "spool" / "run-a" / "proxy.spool"
    spool.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(spool)
    else:
        spool.symlink_to("/dev/zero")
    proc = subprocess.run(
        [str(BIN / "amb"), "watch", "--store", str(tmp_path / "store"), "--once", "--json", "run-a"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    [state] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert state["error"] == f"cannot read {spool}: [Errno 22] not a regular file"
    assert state["events"] == 0
