"""`amb store stats`: its figures agree with du and find, and with the store's own counts."""

from __future__ import annotations

import json
import os
import subprocess

from tests.amb.test_store_cmds import amb


def _du_bytes(path) -> int:
    """What du says the tree occupies (allocated blocks), in bytes: an outside measure."""
    return int(
        subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True).stdout.split()[0]
    )


def _find_sizes(path) -> int:
    out = subprocess.run(
        ["find", str(path), "-type", "f", "-printf", "%s\\n"], capture_output=True, text=True
    )
    return sum(int(n) for n in out.stdout.split())


def test_stats_agree_with_du_and_the_store(tmp_path):
    store = tmp_path / "store"
    amb("generate", "--runs", "2", "--calls", "6", store=store)
    assert "4 spools compressed" in amb("ingest", store=store).stdout
    found = json.loads(amb("store", "stats", "--json", store=store).stdout)

    # everything but the store directory's own entry block (and the empty .open.lock)
    assert found["total"]["disk_bytes"] == _du_bytes(store) - os.lstat(store).st_blocks * 512
    assert found["total"]["content_bytes"] == _find_sizes(store)
    assert found["blobs"]["disk_bytes"] == _du_bytes(store / "blobs")
    assert found["spools"]["disk_bytes"] == _du_bytes(store / "spool")
    assert found["spools"]["content_bytes"] == _find_sizes(store / "spool")
    kinds = found["spools"]["kinds"]
    assert kinds[".spool"]["files"] == 2 and kinds[".spool.zst"]["files"] == 4  # the recorder's stay
    assert kinds[".spool.zst"]["content_bytes"] < kinds[".spool.zst"]["files"] * 20_000

    runs = {r["run_id"]: r for r in found["runs"]}
    n_events = json.loads(
        amb("sql", "SELECT count(*) AS n FROM events", "--format", "json", store=store).stdout
    )
    assert sum(r["events"] for r in runs.values()) == found["events"] == n_events[0]["n"]
    assert found["database"]["tables"]["events"]["rows"] == found["events"]
    assert sum(r["spool_content_bytes"] for r in runs.values()) == found["spools"]["content_bytes"]
    refs = json.loads(
        amb(
            "sql",
            r"""SELECT run_id, count(DISTINCT b) AS n FROM (SELECT run_id, unnest(regexp_extract_all(payload,
                '"blob":"(sha256:[0-9a-f]{64})"', 1)) AS b FROM events) GROUP BY run_id""",
            "--format",
            "json",
            store=store,
        ).stdout
    )
    assert {r["run_id"]: r["n"] for r in refs} == {k: r["blob_refs"] for k, r in runs.items()}
    assert all(r["blob_bytes"] > 0 for r in runs.values())

    table = amb("store", "stats", store=store).stdout
    assert "bytes per event" in table and ".spool.zst" in table and "table events" in table


def test_stats_of_a_missing_store_is_one_clear_error(tmp_path):
    proc = amb("store", "stats", store=tmp_path / "nowhere", check=False)
    assert proc.returncode != 0 and proc.stderr.startswith("amb: error: no store at")
    assert "Traceback" not in proc.stderr
