"""The store commands, run as a user runs them (the installed console script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recorder.importers.store_state import files

AMB = str(Path(sys.executable).parent / "amb")


def amb(*args, store=None, check=True):
    env = os.environ | ({"AMB_STORE": str(store)} if store else {})
    proc = subprocess.run([AMB, *args], capture_output=True, text=True, env=env, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"amb {args} failed ({proc.returncode}): {proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def cli_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("cli") / "store"
    amb("generate", "--runs", "2", "--calls", "8", store=store)
    out = amb("ingest", store=store).stdout
    assert "runs: 2" in out
    return store


@pytest.fixture(scope="module")
def scored_store(cli_store):
    """The store, scored: so that `amb report` has a whole report to print first."""
    amb("score", "--all", store=cli_store)
    return cli_store


def test_runs_json(cli_store):
    rows = json.loads(amb("runs", "--json", store=cli_store).stdout)
    assert [r["run_id"] for r in rows] == ["synth-0000", "synth-0001"]
    assert all(r["status"] == "completed" and r["n_model_calls"] == 8 for r in rows)


def test_show(cli_store):
    text = amb("show", "synth-0000", store=cli_store).stdout
    assert "kidney-seg" in text and "8 model calls" in text and "plan/plan.md" in text
    data = json.loads(amb("show", "synth-0000", "--json", "--events", store=cli_store).stdout)
    assert data["model_calls"]["count"] == 8 and data["tool_calls"]["execute_code"] == 7
    assert data["events"] == len(data["event_list"])
    missing = amb("show", "nope", store=cli_store, check=False)
    assert (
        missing.returncode == 3
        and missing.stderr.strip()
        == f"amb: error: no run 'nope' in the store at {cli_store} (see `amb runs`)"
    )


def test_sql_formats(cli_store):
    q = "SELECT run_id, count(*) AS n FROM model_calls GROUP BY 1 ORDER BY 1"
    assert json.loads(amb("sql", q, "--format", "json", store=cli_store).stdout) == [
        {"run_id": "synth-0000", "n": 8},
        {"run_id": "synth-0001", "n": 8},
    ]
    assert amb("sql", q, "--format", "csv", store=cli_store).stdout.splitlines() == [
        "run_id,n",
        "synth-0000,8",
        "synth-0001,8",
    ]


def test_sql_writes_a_large_result_as_it_comes(cli_store, tmp_path):
    # Rows over several fetches come out as one document; and a million of them as JSON take the
    # memory of a fetch, not of the result (held whole, they took 750 MB).
    q = "SELECT range AS i, 'row ' || range AS s FROM range(25003)"
    rows = json.loads(amb("sql", q, "--format", "json", store=cli_store).stdout)
    assert rows == [{"i": i, "s": f"row {i}"} for i in range(25003)]
    lines = amb("sql", q, "--format", "csv", store=cli_store).stdout.splitlines()
    assert lines == ["i,s", *(f"{i},row {i}" for i in range(25003))]
    # The peak memory of amb alone: the only child of a Python process of its own.
    measure = (
        "import resource, subprocess, sys; "
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    big = "SELECT range AS i FROM range(1000000)"
    argv = [sys.executable, "-c", measure, AMB, "sql", big, "--format", "json", "--store", str(cli_store)]
    peak_kb = int(subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout)
    assert peak_kb < 400 * 1024, peak_kb


@pytest.mark.parametrize(
    "query",
    [
        "COPY events TO 'x.csv'",
        "ATTACH 'x.db'",
        "INSERT INTO events SELECT * FROM events",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELEC nonsense",
    ],
)
def test_sql_refusals_are_one_line(cli_store, query):
    proc = amb("sql", query, store=cli_store, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("amb: error: query refused or failed:") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_verify_and_manifest(cli_store, tmp_path):
    assert amb("verify", store=cli_store).stdout.startswith("OK ")
    m = amb("manifest", "synth-0001", store=cli_store).stdout
    anchored = tmp_path / "anchor.json"
    anchored.write_text(m)
    assert amb("verify", "--manifest", str(anchored), store=cli_store).returncode == 0
    forged = json.loads(m)
    forged["sources"]["proxy"]["events"] += 1
    anchored.write_text(json.dumps(forged))
    bad = amb("verify", "--manifest", str(anchored), store=cli_store, check=False)
    assert (
        bad.returncode == 1
        and bad.stdout.startswith("FAIL run synth-0001")
        and "anchored manifest" in bad.stdout
    )


def test_verify_counts_what_it_verified(cli_store):
    rows = json.loads(
        amb(
            "sql", "SELECT run_id, count(*) AS n FROM events GROUP BY 1", "--format", "json", store=cli_store
        ).stdout
    )
    per_run = {r["run_id"]: r["n"] for r in rows}
    one = amb("verify", "synth-0000", store=cli_store).stdout.strip()
    assert one == f"OK {per_run['synth-0000']} events verified in 1 run"
    assert amb("verify", "synth-0000", "synth-0000", store=cli_store).stdout.strip() == one
    both = amb("verify", "synth-0001", "synth-0000", store=cli_store).stdout.strip()
    assert both == f"OK {sum(per_run.values())} events verified in 2 runs"
    assert amb("verify", store=cli_store).stdout.strip() == both
    missing = amb("verify", "synth-0000", "nope", store=cli_store, check=False)
    assert missing.returncode == 3 and missing.stdout == ""
    assert missing.stderr == f"amb: error: no run 'nope' in the store at {cli_store} (see `amb runs`)\n"


def test_verify_names_the_first_bad_event(tmp_path):
    store = tmp_path / "s"
    amb("generate", "--runs", "1", "--calls", "4", store=store)
    amb("ingest", store=store)
    import duckdb

    con = duckdb.connect(str(store / "amb.duckdb"))
    con.execute(
        "UPDATE events SET payload = replace(CAST(payload AS VARCHAR), '\"kind\":', '\"kind\": ') "
        "WHERE source = 'shim' AND seq = 2"
    )
    kind = con.execute("SELECT kind FROM events WHERE source = 'shim' AND seq = 2").fetchall()[0][0]
    con.close()
    bad = amb("verify", store=store, check=False)
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[0] == (
        f"FAIL run synth-0000 source shim seq 2 ({kind}): hash mismatch: the event was edited after it "
        "was recorded"
    )


def test_schema_outputs():
    schema = json.loads(amb("schema", "--format", "json").stdout)
    kinds = {
        d["properties"]["kind"]["enum"][0]
        for d in schema["$defs"].values()
        if "enum" in d.get("properties", {}).get("kind", {})  # tagged: an event payload
    }
    assert {"run.started", "model_call.completed", "submission.sealed", "note"} <= kinds
    ddl = amb("schema", "--format", "ddl").stdout
    for view in ("runs", "model_calls", "tool_calls", "processes", "file_writes", "network_requests"):
        assert f"CREATE OR REPLACE VIEW {view} AS" in ddl


def test_bad_manifest_file_is_a_usage_error(cli_store, tmp_path):
    f = tmp_path / "m.json"
    f.write_text("{not json")
    proc = amb("verify", "--manifest", str(f), store=cli_store, check=False)
    assert proc.returncode == 2 and "not a manifest" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[1, 2]", "manifest 1 is not a run's manifest: Expected `object`, got `int`"),
        ('{"run_id": "r", "sources": 7}', "manifest 1 is not a run's manifest: Expected `object`, got `int`"),
        ('{"run_id": "r", "sources": {}}\n{"sources": {}}', "manifest 2 is not a run's manifest"),
        ("[" * 100_000 + "]" * 100_000, "not a manifest: nested 100000 levels deep"),
    ],
)
def test_a_manifest_file_of_the_wrong_shape_is_one_usage_error(cli_store, tmp_path, text, said):
    f = tmp_path / "m.json"
    f.write_text(text)
    proc = amb("verify", "--manifest", str(f), store=cli_store, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"amb: error: {f}: {said}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["runs"],
        ["show", "x"],
        ["sql", "SELECT 1"],
        ["verify"],
        ["manifest", "x"],
        ["ingest"],
        ["ingest", "x"],
        ["score", "--all"],
        ["score", "x"],
        ["report"],
        ["audit", "x"],
        ["export", "atif", "--all", "--out", "{tmp}/atif"],
        ["export", "otel", "--all"],
        ["export", "parquet", "{tmp}/parquet"],
        ["gc", "--blobs"],
        ["blobs", "migrate"],
        ["store", "stats"],
        ["files", "x"],
        ["checkout", "x", "{tmp}/co"],
        ["watch", "x", "--once"],
        ["replay", "serve", "x"],
        ["serve", "--port", "0"],
    ],
    ids=" ".join,
)
def test_reading_a_store_that_does_not_exist_is_an_error(tmp_path, command):
    # A command that reads a store, or writes one that must exist, never creates one at a mistyped path.
    missing = tmp_path / "typo-store"
    proc = amb(*(c.format(tmp=tmp_path) for c in command), store=missing, check=False)
    assert proc.returncode == 3 and proc.stderr.startswith("amb: error: no ")
    assert str(missing) in proc.stderr and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr and not missing.exists()


def test_show_a_run_with_no_model_calls(tmp_path):
    """A shell agent makes no model call; its summary must still show (it once raised a TypeError)."""
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    rec = subprocess.run(
        [
            str(Path(AMB).with_name("amb-record")),
            "--store",
            str(store),
            "--",
            "sh",
            "-c",
            "echo hi > out.txt",
        ],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rec.returncode == 0, rec.stderr
    run = rec.stdout.strip().splitlines()[-1]
    shown = amb("show", run, store=store, check=False)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "0 model calls (0 failed) to -" in shown.stdout
    data = json.loads(amb("show", run, "--json", store=store).stdout)
    assert data["model_calls"] == {"count": 0, "failed": 0, "models": []}
    assert data["files_written"] == [] or all("out.txt" in f["path"] for f in data["files_written"])


def test_generate_never_writes_into_a_run_id_the_store_holds(tmp_path):
    """A second `amb generate` into one store appended a second run to the first run's spools;
    it is refused before a byte is written, ingested or not."""
    store = tmp_path / "store"
    amb("generate", "--runs", "2", "--calls", "2", store=store)
    for ingested in (False, True):
        before = files(store)
        again = amb("generate", "--runs", "3", "--calls", "2", store=store, check=False)
        assert again.returncode == 2, again.stderr
        assert again.stderr.count("\n") == 1 and "Traceback" not in again.stderr
        assert "run id 'synth-0000' already exists" in again.stderr and "--seed or --prefix" in again.stderr
        assert files(store) == before
        if not ingested:
            amb("ingest", store=store)
    amb("generate", "--runs", "1", "--calls", "2", "--seed", "2", store=store)
    amb("ingest", store=store)
    assert amb("verify", store=store).stdout.startswith("OK")


def test_the_runs_of_one_generate_share_one_pack(tmp_path):
    store = tmp_path / "store"
    amb("generate", "--runs", "3", "--calls", "2", store=store)
    assert len(list((store / "blobs" / "packs").glob("*.pack"))) == 1


@pytest.mark.parametrize(
    "args",
    [
        ("--runs", "-1"),
        ("--runs", "0"),
        ("--calls", "0"),
        ("--calls", "-3"),
        ("--calls", "20000"),
        ("--seed", "-1"),
        ("--seed", str(10**7)),
        ("--seed", "999999", "--runs", "5"),
        ("--processes-per-call", "0"),
        ("--prefix", "a/b"),
        ("--prefix", "x" * 200),
    ],
)
def test_generate_refuses_bad_numbers_and_names(tmp_path, args):
    store = tmp_path / "store"
    proc = amb("generate", "--calls", "1", *args, store=store, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "wrote" not in proc.stdout and not store.exists()


@pytest.mark.parametrize("query", ["", "   ", " ; -- nothing"])
def test_sql_without_a_statement_is_one_line(cli_store, query):
    proc = amb("sql", query, store=cli_store, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("amb: error: no statement in the query") and proc.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("command", "code", "message"),
    [
        (["checkout", "synth-0000", "{file}/sub"], 2, "DIRECTORY '{file}/sub': '{file}' is not a folder"),
        (["checkout", "synth-0000", "/proc/x"], 2, "DIRECTORY '/proc/x': cannot write in '/proc'"),
        (["export", "otel", "synth-0000", "--out", "{tmp}"], 2, "--out '{tmp}': is a folder"),
        (["export", "otel", "synth-0000", "--out", "/missing/x"], 3, "there is no folder '/missing'"),
        (["export", "parquet", "/proc/x"], 2, "OUT '/proc/x': cannot write in '/proc'"),
        (["export", "atif", "synth-0000", "--out", "/proc/y"], 2, "--out '/proc/y': cannot write in '/proc'"),
        (["report", "--html", "/missing/x.html"], 3, "--html '/missing/x.html': there is no folder"),
        (["report", "--html", "{tmp}"], 2, "Invalid value for '--html': File '{tmp}' is a directory"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_where_a_command_writes_is_checked_before_its_work(scored_store, tmp_path, command, code, message):
    cli_store = scored_store
    file = tmp_path / "a-file"
    file.write_text("x")
    fill = {"file": file, "tmp": tmp_path}
    proc = amb(*(c.format(**fill) for c in command), store=cli_store, check=False)
    assert proc.returncode == code and proc.stdout == "", proc.stdout[-300:] + proc.stderr[-2000:]
    assert proc.stderr.startswith("amb: error: ") and message.format(**fill) in proc.stderr
    assert proc.stderr.count("\n") == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_runs_says_what_waits_for_ingest(tmp_path):
    store = tmp_path / "s"
    amb("generate", "--runs", "2", "--calls", "3", store=store)
    nothing = amb("runs", store=store, check=False)
    assert nothing.returncode == 3 and nothing.stderr == (
        f"amb: error: no database at {store} yet: 2 recorded run(s) wait in {store / 'spool'}; "
        "run `amb ingest`\n"
    )
    amb("ingest", "synth-0000", store=store)
    listed = amb("runs", "--json", store=store)
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ["synth-0000"]
    assert listed.stderr == (
        f"amb: 1 more recorded run(s) wait in {store / 'spool'} (synth-0001); run `amb ingest` to list them\n"
    )
    amb("ingest", store=store)
    assert amb("runs", store=store).stderr == ""


def test_an_error_line_quoting_a_hostile_name_stays_one_printable_line(cli_store, tmp_path):
    """An error message quotes what it was given (here a file's name; elsewhere an agent's text):
    a newline breaks no line and a terminal escape is shown escaped, never obeyed."""
    hostile = tmp_path / "anchor\x1b[2J\nforged.json"
    hostile.write_text("not json at all")
    proc = amb("verify", "--manifest", str(hostile), store=cli_store, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "\x1b" not in proc.stderr
    assert "anchor\\x1b[2J forged.json" in proc.stderr  # white space folded, the escape shown


def test_a_table_cell_shows_control_characters_escaped(cli_store):
    """`amb sql` tables show what agents wrote (model output, tool arguments): an escape sequence in a
    cell is shown, not sent to the terminal."""
    out = amb("sql", "SELECT chr(27) || '[2Jcleared' || chr(9) || 'x' AS t", store=cli_store).stdout
    assert "\x1b" not in out and "\\x1b[2Jcleared\\tx" in out
