"""A name that ends in a newline is no run id, digest or shard file name: the patterns that check
them match the whole string (``$`` alone would also match before a final newline)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recorder.importers.automedbench import TASK_RE
from replay.shard_check import BLOB_RE, PACK_RE, PACKFILE_RE, SPOOL_RE
from schemas.blob import DIGEST_RE
from schemas.codec import ID_RE

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        (ID_RE, "run-a"),
        (TASK_RE, "bccd-det"),
        (DIGEST_RE, "sha256:" + "0" * 64),
        (SPOOL_RE, "spool/run-a/proxy.spool"),
        (PACK_RE, "spool/run-a/proxy.blobs"),
        (BLOB_RE, "blobs/00/" + "0" * 62),
        (PACKFILE_RE, "blobs/packs/" + "0" * 16 + "-1-000000.pack"),
    ],
)
def test_a_trailing_newline_is_not_part_of_a_name(pattern, name: str) -> None:
    assert pattern.match(name)
    assert not pattern.match(name + "\n")


def test_amb_record_refuses_a_run_id_ending_in_a_newline_before_it_makes_anything(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = subprocess.run(
        [
            str(BIN / "amb-record"),
            "--store",
            str(store),
            "--run-id",
            "evil\n",
            "--backend",
            "local",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr
        == "amb-record: error: 'evil\\n' is not a run id (1-128 of letters, digits, '.', '_', ':', '-')\n"
    )
    assert not (store / "spool").exists() or list((store / "spool").iterdir()) == []
