"""Imports never write into a run id the store holds, and import under a new id when asked.

- An ATIF folder `amb export atif` wrote keeps its run's id: imported into the store it came from,
  it is refused (exit 2, one line naming the id and the way out) and the store stays byte for byte
  as it was, ingested or still waiting as spools; `--run-id NEW` imports it beside the original.
- The same input imported again is skipped (nothing written); another input making a run of the
  same id is refused; `--id-suffix` renames every run of every input, sub-agents' parent links too.
- `--run-id` and `--id-suffix` are checked before anything is read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from recorder.synthetic import generate_run
from tests.recorder.importers.store_state import amb, event_hashes, files


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, Path]:
    """A store holding the recorded run ``rec-1`` (ingested) and its ATIF export."""
    store = tmp_path / "store"
    generate_run(store, "rec-1", seed=1, calls=3)
    assert amb("ingest", "--store", str(store)).exit_code == 0
    out = tmp_path / "atif"
    assert amb("export", "atif", "--store", str(store), "rec-1", "--out", str(out)).exit_code == 0
    return store, out / "rec-1"


@pytest.mark.parametrize("ingested", [True, False])
def test_an_export_is_not_imported_into_the_run_it_came_from(exported, tmp_path, ingested):
    store, folder = exported
    if not ingested:  # the run still waits as spools: a fresh store with the same spools
        waiting = tmp_path / "waiting"
        generate_run(waiting, "rec-1", seed=1, calls=3)
        store = waiting
    before = files(store)
    r = amb("import", "atif", "--store", str(store), str(folder))
    assert r.exit_code == 2, r.output
    errors = [x for x in r.stderr.splitlines() if x.startswith("amb: error:")]
    assert len(errors) == 1 and "Traceback" not in r.output
    assert "run id 'rec-1' already exists" in errors[0] and "--run-id NEW" in errors[0]
    assert str(folder.name) in errors[0]
    assert files(store) == before
    if ingested:
        assert amb("verify", "--store", str(store)).output.startswith("OK")


def test_run_id_imports_beside_the_original(exported):
    store, folder = exported
    original = event_hashes(store)["rec-1"]
    r = amb("import", "atif", "--store", str(store), "--json", "--run-id", "rec-1-again", str(folder))
    assert r.exit_code == 0, r.output
    assert [(x["status"], x["run_id"]) for x in json.loads(r.stdout)] == [("imported", "rec-1-again")]
    after = event_hashes(store)
    assert after["rec-1"] == original and len(after["rec-1-again"]) == len(original)
    show = json.loads(amb("show", "--store", str(store), "rec-1-again", "--json").output)
    assert show["labels"]["renamed_from"] == "rec-1"
    assert amb("verify", "--store", str(store)).output.startswith("OK")
    # The same input under the same new id: already there, skipped.
    again = amb("import", "atif", "--store", str(store), "--json", "--run-id", "rec-1-again", str(folder))
    assert again.exit_code == 0 and json.loads(again.stdout)[0]["status"] == "skipped"


def _changed(folder: Path, to: Path) -> Path:
    """A copy of an exported folder whose last step says something else: the same run id, another run."""
    shutil.copytree(folder, to)
    doc = json.loads((to / "trajectory.json").read_text())
    doc["steps"][-1]["message"] = "something else"
    (to / "trajectory.json").write_text(json.dumps(doc))
    return to


def test_another_input_under_an_imported_id_is_refused(exported, tmp_path):
    _, folder = exported
    store = tmp_path / "fresh"
    assert amb("import", "atif", "--store", str(store), str(folder)).exit_code == 0
    before = files(store)
    r = amb("import", "atif", "--store", str(store), str(_changed(folder, tmp_path / "changed")))
    assert r.exit_code == 2 and "run id 'rec-1' already exists" in r.stderr, r.output
    assert "another import spool" in r.stderr and files(store) == before
    # The same input twice in one command, and again later: written once, then skipped.
    twice = amb("import", "atif", "--store", str(tmp_path / "twice"), "--json", str(folder), str(folder))
    assert [x["status"] for x in json.loads(twice.stdout)] == ["imported", "skipped"]


def test_of_two_inputs_making_one_run_the_first_given_is_written(exported, tmp_path):
    """Inputs are read by several threads; the first input wins even when it takes longest to read."""
    _, folder = exported
    slow = shutil.copytree(folder, tmp_path / "slow")
    doc = json.loads((slow / "trajectory.json").read_text())
    filler = [dict(doc["steps"][0], step_id=len(doc["steps"]) + 1 + i) for i in range(3000)]
    doc["steps"] += filler
    (slow / "trajectory.json").write_text(json.dumps(doc))
    quick = _changed(folder, tmp_path / "quick")
    store = tmp_path / "fresh"
    r = amb("import", "atif", "--store", str(store), "--json", str(slow), str(quick))
    assert r.exit_code == 2, r.output
    assert [x["status"] for x in json.loads(r.stdout)] == ["imported", "rejected"], r.stdout
    assert "also made, with other content, by another input" in r.stderr and "quick" in r.stderr
    assert len(event_hashes(store)["rec-1"]) > 3000


def test_id_suffix_renames_every_run_and_its_sub_agents(tmp_path):
    doc = {
        "schema_version": "ATIF-v1.6",
        "session_id": "s",
        "agent": {"name": "a", "version": "1"},
        "steps": [{"step_id": 1, "source": "agent", "message": "hi", "timestamp": "2025-01-01T00:00:00Z"}],
    }
    doc["subagent_trajectories"] = [dict(doc, session_id="sub")]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    store = tmp_path / "store"
    first = amb("import", "atif", "--store", str(store), "--json", str(path))
    ids = [x["run_id"] for x in json.loads(first.stdout)]
    assert len(ids) == 2
    r = amb("import", "atif", "--store", str(store), "--json", "--id-suffix", ".b", str(path))
    assert r.exit_code == 0, r.output
    assert [x["run_id"] for x in json.loads(r.stdout)] == [i + ".b" for i in ids]
    sub = json.loads(amb("show", "--store", str(store), ids[1] + ".b", "--json").output)
    assert sub["labels"]["parent_run"] == ids[0] + ".b" and sub["labels"]["renamed_from"] == ids[1]
    one = amb("import", "atif", "--store", str(store), "--run-id", "x", str(path))
    assert one.exit_code == 2 and "holds 2 runs" in one.stderr and "--id-suffix" in one.stderr
    assert amb("verify", "--store", str(store)).output.startswith("OK")


@pytest.mark.parametrize(
    "args",
    [
        ("--run-id", "bad id"),
        ("--run-id", "x" * 200),
        ("--id-suffix", "/.."),
        ("--run-id", "a", "--id-suffix", "b"),
        ("--run-id", "a", "t.json", "u.json"),
    ],
)
def test_bad_renamings_are_usage_errors(tmp_path, args):
    r = amb(
        "import",
        "atif",
        "--store",
        str(tmp_path / "store"),
        *args,
        *(["t.json"] if "t.json" not in args else []),
    )
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert not (tmp_path / "store").exists()


def test_an_import_the_store_dropped_after_ingest_is_still_recognised(exported, tmp_path):
    """With AMB_SPOOLS=drop the import's spool is gone after ingest (an empty marker is left): the
    same input again is told apart from another by the chain head ingest recorded."""
    from click.testing import CliRunner

    from amb.main import cli

    _, folder = exported
    store = tmp_path / "dropped"
    first = CliRunner().invoke(
        cli, ["import", "atif", "--store", str(store), str(folder)], env={"AMB_SPOOLS": "drop"}
    )
    assert first.exit_code == 0, first.output
    assert (store / "spool" / "rec-1" / "import.spool.dropped").exists()
    again = amb("import", "atif", "--store", str(store), "--json", str(folder))
    assert again.exit_code == 0 and json.loads(again.stdout)[0]["status"] == "skipped", again.output
    before = files(store)
    r = amb("import", "atif", "--store", str(store), str(_changed(folder, tmp_path / "changed")))
    assert r.exit_code == 2 and "another import spool" in r.stderr, r.output
    assert files(store) == before
