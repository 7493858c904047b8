"""Hostile input to every command that takes a path, a file, a name or a number (imports, `amb ingest
--from` and `amb generate` have their own suite).

Each command is driven in this process (click's runner; amb-record through its own ``main``) with
generated values where a user gives a run id, a path, a label, a profile or a number: bytes that
are not UTF-8 (as Python hands argv to a program: lone surrogates), control characters, 1 MB names,
NaN, ±inf, 1e308, negative counts, ids the store holds and ids it does not. Whatever the value:
no traceback, an exit code of the contract (0 done, 1 failed, 2 bad input, 3 not found) with one
line on stderr when it is not 0, and afterwards `amb verify` clean and every stored event as it was.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amb.main import cli
from recorder.synthetic import generate_run
from replay.ingest import ingest
from replay.store import Store

RUNS = ("run-a", "run-b")
"""The runs of the module's store."""

EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

BIG = "x" * (1 << 20)
NASTY_TEXT = [
    "",
    " ",
    "-",
    "--",
    ".",
    "..",
    "../etc",
    "a/../../b",
    "/",
    "/etc/passwd",
    "/proc/self/mem",
    "/dev/null",
    "/proc/x",
    "x\udcff",  # the byte 0xff of an argv, as Python decodes it
    "\udc80\udcfe",
    "a\x1b[2Jb\x07",
    "\t\n\r\x0b\x0c",
    "\u202egnp.exe",
    "名前",
    BIG,
    "a/" * 5000,
    "nope",
    "synth-0000",
    *RUNS,
]
NASTY_NUMBERS = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "+inf",
    "1e308",
    "-1e308",
    "1e309",
    "-1",
    "-0",
    "0",
    "9" * 400,
    "18446744073709551616",
    "-9223372036854775809",
    "0x10",
    " 1",
    "1_000",
    "",
    "x\udcff",
]

SURROGATES: list[Literal["Cs"]] = ["Cs"]
"""Left out of the printable text (they come from the bytes strategy below, as argv gives them)."""

text = st.one_of(
    st.sampled_from(NASTY_TEXT),
    st.text(st.characters(blacklist_categories=SURROGATES, blacklist_characters="\x00"), max_size=30),
    # Bytes that are not UTF-8, as Python hands them over from argv (surrogate escapes).
    st.binary(min_size=1, max_size=8)
    .filter(lambda b: b"\0" not in b)
    .map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.text(st.characters(max_codepoint=0x1F, blacklist_characters="\x00"), min_size=1, max_size=5),
)
"""A name, a path, a label: anything argv can carry (all but NUL)."""

number = st.one_of(
    st.sampled_from(NASTY_NUMBERS),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
"""What a user may type where a number goes."""

run_id = st.one_of(st.sampled_from(RUNS), text)
not_a_run = text.filter(lambda t: t not in RUNS)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile-cli") / "store"
    for i, run in enumerate(RUNS):
        generate_run(root, run, seed=i, calls=4)
    ingest(root)
    scored = invoke(["score", "--all", "--store", str(root)])
    assert scored.exit_code == 0, scored.output
    return root


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path, monkeypatch):
    """Hostile relative paths land in a folder of the test's own, not in the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """A directory that holds no sweep (sweep status and cancel must say so, and touch nothing)."""
    return tmp_path_factory.mktemp("not-a-sweep")


def invoke(args: Sequence[str]):
    env = {"AMB_JUDGE_BASE_URL": "", "AMB_JUDGE_MODEL": "", "AMB_STORE": "", "COLUMNS": "200"}
    return CliRunner().invoke(cli, list(args), env=env)


def events(root: Path) -> list[tuple]:
    with Store.open(root, read_only=True) as st_:
        return st_.con.execute("SELECT run_id, source, seq, hash FROM events ORDER BY ALL").fetchall()


TRACEBACK = "Traceback (most recent call last)"


def check_contract(code: int, stdout: str, stderr: str, exception: BaseException | None, prog: str) -> None:
    """No traceback; a documented exit code; a failure is one line on stderr."""
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    # The heading of a Python traceback: a generated name may well spell "Traceback" on its own.
    assert TRACEBACK not in stdout and TRACEBACK not in stderr
    assert code in (0, 1, 2, 3), (code, stderr[-500:])
    if code in (2, 3):
        assert stderr.startswith(f"{prog}: error: ") and stderr.count("\n") == 1, stderr[-2000:]


def check_cli(args: Sequence[str]) -> int:
    result = invoke(args)
    check_contract(result.exit_code, result.stdout, result.stderr, result.exception, "amb")
    return result.exit_code


@contextlib.contextmanager
def store_unchanged(root: Path):
    """The store's events as they were, and `amb verify` clean, after whatever ran inside."""
    before = events(root)
    yield
    assert events(root) == before
    verified = invoke(["verify", "--store", str(root)])
    assert verified.exit_code == 0 and verified.stdout.startswith("OK "), verified.output


Command = Callable[..., list[str]]

# Each: a name, the strategies of its values, and the command line they make. The store is added as
# --store (or given in place of one, where the hostile value is the store itself).
RUN_COMMANDS: list[tuple[str, tuple, Command]] = [
    ("show", (run_id,), lambda r: ["show", r, "--json"]),
    ("verify", (run_id, run_id), lambda a, b: ["verify", a, b]),
    ("manifest", (run_id,), lambda r: ["manifest", r]),
    ("audit", (run_id, text), lambda r, p: ["audit", r, "--profile", p]),
    ("audit-run", (run_id,), lambda r: ["audit", r, "--json"]),
    ("score", (run_id, number), lambda r, j: ["score", r, "--jobs", j]),
    ("score-profile", (run_id, text), lambda r, p: ["score", r, "--profile", p]),
    ("score-repeat", (number,), lambda n: ["score", "run-a", "--repeat", n]),
    ("ingest", (run_id,), lambda r: ["ingest", r]),
    ("files", (run_id, text), lambda r, m: ["files", r, "--at", m]),
    ("files-diff", (text, text), lambda a, b: ["files", "run-a", "--diff", a, b]),
    ("checkout-step", (run_id, number), lambda r, n: ["checkout", r, "{tmp}/co", "--step", n]),
    ("checkout-time", (text,), lambda t: ["checkout", "run-a", "{tmp}/co", "--time", t]),
    ("watch", (run_id, number), lambda r, n: ["watch", r, "--once", "--interval", n]),
    ("watch-prices", (text,), lambda t: ["watch", "run-a", "--once", "--price-table", t]),
    ("export-atif", (run_id,), lambda r: ["export", "atif", r, "--out", "{tmp}/atif"]),
    ("export-otel", (run_id,), lambda r: ["export", "otel", r, "--out", "{tmp}/otel.jsonl"]),
    (
        "export-parquet",
        (run_id, number),
        lambda r, n: ["export", "parquet", "{tmp}/pq", "--runs", r, "--events-per-file", n],
    ),
    # Never a stored run: with one and a free port it would rightly serve until stopped.
    ("replay-serve", (not_a_run, number), lambda r, p: ["replay", "serve", r, "--port", p]),
    ("report", (text, text), lambda p, j: ["report", "--profile", p, "--judge", j]),
    ("report-diff", (text, text), lambda a, b: ["report", "--diff-profiles", a, b]),
    ("judge-compare", (text, text), lambda a, b: ["judge", "compare", "--a", a, "--b", b]),
    ("gc-blobs", (number,), lambda n: ["gc", "--blobs", "--wait", n]),
    ("sql", (text,), lambda q: ["sql", q]),
    ("runs", (), lambda: ["runs", "--json"]),
    ("store-stats", (), lambda: ["store", "stats", "--json"]),
    ("blobs-migrate", (), lambda: ["blobs", "migrate", "--json"]),
]
"""Commands of the store, each given hostile run ids, names and numbers."""

PATH_COMMANDS: list[tuple[str, Command]] = [
    ("checkout", lambda p: ["checkout", "run-a", p]),
    ("export-atif", lambda p: ["export", "atif", "run-a", "--out", p]),
    ("export-otel", lambda p: ["export", "otel", "run-a", "--out", p]),
    ("export-parquet", lambda p: ["export", "parquet", p, "--runs", "run-a"]),
    ("report-html", lambda p: ["report", "--html", p]),
    ("verify-manifest", lambda p: ["verify", "--manifest", p]),
    ("score-references", lambda p: ["score", "run-a", "--references", p]),
    ("watch-sweep", lambda p: ["watch", "--sweep", p, "--once"]),
]
"""Commands given a hostile path to write to or read from."""

STORE_COMMANDS: list[Command] = [
    lambda s: ["runs", "--store", s],
    lambda s: ["show", "run-a", "--store", s],
    lambda s: ["sql", "SELECT 1", "--store", s],
    lambda s: ["verify", "--store", s],
    lambda s: ["score", "--all", "--store", s],
    lambda s: ["report", "--store", s],
    lambda s: ["audit", "run-a", "--store", s],
    lambda s: ["export", "otel", "--all", "--store", s],
    lambda s: ["gc", "--blobs", "--store", s],
    lambda s: ["blobs", "migrate", "--store", s],
    lambda s: ["store", "stats", "--store", s],
    lambda s: ["watch", "run-a", "--once", "--store", s],
    lambda s: ["files", "run-a", "--store", s],
    lambda s: ["ingest", "--store", s],
]
"""Commands given a hostile --store (that must not become a store)."""


def _fill(args: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) if a.startswith("{tmp}") else a for a in args]


@pytest.mark.parametrize(("name", "strategies", "command"), RUN_COMMANDS, ids=[c[0] for c in RUN_COMMANDS])
def test_hostile_names_and_numbers(store, tmp_path_factory, name, strategies, command):
    tmp = tmp_path_factory.mktemp(f"out-{name}")

    @EXAMPLES
    @given(st.tuples(*strategies))
    def run(values):
        out = tmp / "o"
        out.mkdir(exist_ok=True)
        args = _fill(command(*values), out)
        check_cli([*args, "--store", str(store)])

    with store_unchanged(store):
        run()


@pytest.mark.parametrize(("name", "command"), PATH_COMMANDS, ids=[c[0] for c in PATH_COMMANDS])
def test_hostile_paths(store, tmp_path_factory, name, command):
    tmp = tmp_path_factory.mktemp(f"path-{name}")
    (tmp / "a-file").write_text("x")
    relative = st.sampled_from(["a-file", "a-file/sub", "new/deeper/x", "."]).map(lambda p: str(tmp / p))

    @EXAMPLES
    @given(st.one_of(text, relative))
    def run(path):
        check_cli([*command(path), "--store", str(store)])

    with store_unchanged(store):
        run()


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda c: " ".join(c("S")[:2]))
def test_hostile_store_paths(store, tmp_path_factory, command):
    tmp = tmp_path_factory.mktemp("stores")
    made = st.sampled_from(["typo", "a/b/c", "."]).map(lambda p: str(tmp / p))

    @settings(EXAMPLES, max_examples=12)
    @given(st.one_of(text.filter(lambda s: s not in ("", ".", "/")), made))
    def run(path):
        before = sorted(p.name for p in tmp.iterdir())
        code = check_cli(command(path))
        assert code in (2, 3), code  # none of these is a store
        assert sorted(p.name for p in tmp.iterdir()) == before  # and none was made one

    run()


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("grade-task", lambda t, n: ["grade", t, "--submission", n, "--reference", n]),
        (
            "grade-profile",
            lambda t, n: ["grade", "kidney-seg", "--submission", ".", "--reference", ".", "--profile", t],
        ),
        ("task-show", lambda t, n: ["task", "show", t]),
        ("task-synth", lambda t, n: ["task", "synth", t, "--out", "{tmp}/s", "--cases", n]),
        ("task-synth-seed", lambda t, n: ["task", "synth", "no-task", "--out", t, "--seed", n]),
        ("task-prepare", lambda t, n: ["task", "prepare", t, "--source", n, "--out", "{tmp}/p"]),
        ("sweep-status", lambda t, n: ["sweep", "status", t]),
        ("sweep-cancel", lambda t, n: ["sweep", "cancel", "{sweep}", "--wait", n]),
        ("serve", lambda t, n: ["serve", "--port", n, "--host", t]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_hostile_files_commands(store, sweep_dir, tmp_path_factory, name, command):
    tmp = tmp_path_factory.mktemp(f"files-{name}")
    # `amb task synth` of a real task with a huge count would run for ever: hostile names only.
    task = text.filter(lambda s: s not in ("kidney-seg",))

    @EXAMPLES
    @given(task, number)
    def run(t, n):
        if name == "serve" and n.strip().lstrip("+").isdigit() and 0 <= int(n) <= 65535:
            n = "-1"  # a port that could be bound would serve for ever: validation only
        args = [a.replace("{tmp}", str(tmp)).replace("{sweep}", str(sweep_dir)) for a in command(t, n)]
        check_cli([*args, "--store", str(store)] if args[0] == "serve" else args)

    with store_unchanged(store):
        run()


def record(argv: list[str]) -> tuple[int, str, str, BaseException | None]:
    """amb-record ARGV in this process: its exit code, stdout, stderr and any exception."""
    from amb.record import main

    out, err = io.StringIO(), io.StringIO()
    code, exc = 0, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # noqa: BLE001 (what the contract forbids: reported by the test)
            code, exc = 1, e
    return code, out.getvalue(), err.getvalue(), exc


RECORD_OPTIONS = [
    ("--label", text.map(lambda s: f"k={s}")),
    ("--label", text),
    ("--run-id", run_id),
    ("--task", text),
    ("--agent", text),
    ("--model", text),
    ("--upstream", text.map(lambda s: f"openai={s}")),
    ("--upstream", text),
    ("--allow-host", text),
    ("--time-limit", number),
    ("--grace", number),
    ("--max-tokens", number),
    ("--max-calls", number),
    ("--max-cost", number),
    ("--price-table", text),
    ("--data", text),
    ("--gpus", text),
    ("--tier", text),
    ("--backend", text),
    ("--replay-match", text),
]


@pytest.mark.parametrize(("option", "values"), RECORD_OPTIONS, ids=[o for o, _ in RECORD_OPTIONS])
def test_hostile_record_options(store, option, values):
    # Every option is checked before the replayed run is looked up, so a value that passes ends at
    # `--replay no-such-run` (not found): nothing is recorded and nothing is made, whatever the value.
    @EXAMPLES
    @given(values)
    def run(value):
        spools = sorted(p.name for p in (store / "spool").iterdir())
        argv = ["--store", str(store), option, value, "--replay", "no-such-run", "--", "true"]
        code, out, err, exc = record(argv)
        check_contract(code, out, err, exc, "amb-record")
        assert code in (2, 3), (code, err)
        assert sorted(p.name for p in (store / "spool").iterdir()) == spools

    with store_unchanged(store):
        run()


def test_the_store_fixture_is_what_the_suite_thinks(store):
    listed = invoke(["runs", "--json", "--store", str(store)])
    assert listed.exit_code == 0, listed.output
    runs = json.loads(listed.stdout)
    assert [r["run_id"] for r in runs] == list(RUNS)
