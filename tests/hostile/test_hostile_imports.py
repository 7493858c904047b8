"""Hostile input for every command that writes runs: `amb import atif|automedbench|inspect`, `amb ingest
--from`, `amb generate`, driven with generated values.

Values: non-UTF-8 bytes in file names and run folders, lone surrogates and control characters in
JSON strings and arguments, 1 MB names, NaN, ±inf, 1e308, negative and 64-bit-overflowing counts,
timestamps from year 1 to 9999, and run ids the store already holds. Whatever the input, the
command ends without a traceback, with its documented exit code (0 done, 2 bad input; `ingest
--from` also 1, a shard that is damaged rather than misnamed), every error line printable and one
line, a refused input leaves the store byte for byte as it was, and `amb verify` is clean on the
store afterwards with its existing runs' event hashes unchanged.

Commands run in this process (click's CliRunner); each example works on a fresh copy of a store
built once per module.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recorder.synthetic import generate_run
from tests.recorder.importers import amb_fixtures as fx
from tests.recorder.importers.store_state import amb, event_hashes, files

EXAMPLES = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

MB_NAME = "n" * (1 << 20)

NUMBERS = st.one_of(
    st.sampled_from(
        [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, -1, 0.5, 2**63, 2**64, 10**30]
    ),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
)
"""What a foreign file may hold where a count, a duration or a time belongs."""

TEXT = st.one_of(
    st.lists(st.integers(0, 0x10FFFF).map(chr), max_size=12).map("".join),  # surrogates, controls
    st.sampled_from(["\ud800", "x\udcff", "\x00\n\r\t\x1b[31m", "\u2028\u202e", "a" * (1 << 20)]),
)
"""Text a foreign file may hold: any code point, lone surrogates and control characters included."""

STAMPS = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)).map(
        lambda d: d.isoformat()
    ),
    st.sampled_from(
        ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2262-04-12T00:00:00Z"]
    ),
    TEXT,
    NUMBERS,
)

NAME_BYTES = st.binary(min_size=1, max_size=80).filter(lambda b: b"/" not in b and b"\0" not in b)
"""A file name's bytes as Linux allows them (not necessarily UTF-8)."""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A store with recorded runs (rec-1, synth-0002) and an imported one; rec-1's ATIF export; an
    AutoMedBench run folder; an Inspect log (JSON)."""
    root = tmp_path_factory.mktemp("hostile-imports")
    store = root / "store"
    generate_run(store, "rec-1", seed=1, calls=2)
    generate_run(store, "synth-0002", seed=2, calls=1)  # an id `amb generate` makes
    assert amb("ingest", "--store", str(store)).exit_code == 0
    assert amb("export", "atif", "--store", str(store), "rec-1", "--out", str(root / "atif")).exit_code == 0
    assert (
        amb(
            "import", "atif", "--store", str(store), "--run-id", "imp-1", str(root / "atif" / "rec-1")
        ).exit_code
        == 0
    )
    seg = fx.seg_local(root / "src", "kidney-seg", "kidney", root)
    return {
        "root": root,
        "store": store,
        "atif": root / "atif" / "rec-1",
        "seg": seg,
        "inspect": _inspect_log(root),
    }


def _inspect_log(root: Path) -> Path:
    from tests.recorder.importers.test_inspect import write_logs

    (root / "inspect").mkdir()
    return write_logs(root / "inspect")[1]


@contextmanager
def fresh(base: dict[str, Path]) -> Iterator[tuple[Path, Path]]:
    """(a copy of the base store, a scratch folder), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="amb-hostile-") as tmp:
        store = Path(tmp) / "store"
        shutil.copytree(base["store"], store)
        yield store, Path(tmp)


def check(store: Path, result: Result, codes: tuple[int, ...] = (0, 2)) -> None:
    """The command's contract, and the store's integrity after it."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback: the bug this suite looks for
    assert result.exit_code in codes, (result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output
    for line in result.stderr.splitlines():
        assert line.isprintable(), repr(line[:300])
    if result.exit_code == 2:
        assert any(x.startswith(("amb: error:", "Error:")) for x in result.stderr.splitlines()), result.stderr
    verify = amb("verify", "--store", str(store))
    assert verify.exit_code == 0 and verify.output.startswith("OK"), verify.output


def _import_checked(store: Path, kind: str, *args: str) -> Result:
    """`amb import KIND --store STORE ARGS`, checked: a rejection leaves the store as it was, the
    runs that were there keep every event hash."""
    before_files, before = files(store), event_hashes(store)
    r = amb("import", kind, "--store", str(store), *args)
    check(store, r)
    if r.exit_code == 2:
        assert files(store) == before_files
    after = event_hashes(store)
    assert {run: after.get(run) for run in before} == before
    return r


def _atif(step: dict[str, Any], agent: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": "ATIF-v1.6",
        "session_id": "hostile",
        "agent": {"name": "a", "version": "1", **agent},
        "steps": [
            {"step_id": 1, "source": "user", "message": "hi", "timestamp": "2025-01-01T00:00:00Z"},
            {"step_id": 2, "source": "agent", "message": "ok", **step},
        ],
    }


@EXAMPLES
@given(
    stamp=STAMPS,
    prompt=NUMBERS,
    completion=NUMBERS,
    latency=NUMBERS,
    ts_ns=NUMBERS,
    model=TEXT,
    message=TEXT,
)
def test_import_atif_with_hostile_values(base, stamp, prompt, completion, latency, ts_ns, model, message):
    step = {
        "timestamp": stamp,
        "message": message,
        "model_name": model,
        "metrics": {"prompt_tokens": prompt, "completion_tokens": completion},
        "extra": {"amb": {"ts_ns": ts_ns, "call": {"latency_ms": latency}}},
    }
    with fresh(base) as (store, tmp):
        path = tmp / "t.json"
        path.write_text(
            json.dumps(_atif(step, {"model_name": model})), encoding="utf-8", errors="surrogatepass"
        )
        _import_checked(store, "atif", str(path))


@EXAMPLES
@given(name=st.one_of(NAME_BYTES, st.just(b"<1 MB>")), run_id=st.one_of(st.none(), TEXT))
def test_import_atif_from_hostile_file_names(base, name, run_id):
    """Names with bytes that are not UTF-8, control characters or 1 MB; an exported folder whose
    run id the store holds, with or without a hostile --run-id."""
    name = MB_NAME.encode() if name == b"<1 MB>" else name
    with fresh(base) as (store, tmp):
        doc = json.loads((base["atif"] / "trajectory.json").read_text())
        try:
            fd = os.open(os.fsencode(tmp) + b"/" + name, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError:
            given_path, exists = os.fsdecode(name), False  # too long to exist: named all the same
        else:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            given_path, exists = os.fsdecode(os.fsencode(tmp) + b"/" + name), True
        r = _import_checked(store, "atif", *(["--run-id", run_id] if run_id is not None else []), given_path)
        if run_id is None:
            assert r.exit_code == 2  # rec-1's id, held by the store, or no such file
            assert ("already exists" if exists else "cannot read") in r.stderr, r.stderr[:2000]


@EXAMPLES
@given(
    field=st.sampled_from(["input_tokens", "output_tokens", "ts", "turn", "api_s"]),
    value=NUMBERS,
    text=TEXT,
    out_name=NAME_BYTES,
)
def test_import_automedbench_with_hostile_values(base, field, value, text, out_name):
    with fresh(base) as (store, tmp):
        run = tmp / "260101-abcdef"
        shutil.copytree(base["seg"], run, symlinks=True)
        trace = run / "process" / "trace.jsonl"
        recs = [json.loads(x) for x in trace.read_text().splitlines() if x.strip()]
        first = next(r for r in recs if r.get("type") == "api_call")
        first[field] = value
        first["content_preview"] = text
        trace.write_text(
            "".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8", errors="surrogatepass"
        )
        outputs = os.fsencode(run / "outputs" / "agents_outputs")
        try:
            with open(outputs + b"/" + out_name, "wb") as f:  # an output file named by the agent
                f.write(b"x")
        except OSError:
            pass  # a name the file system refuses (too long): no such file to import
        _import_checked(store, "automedbench", str(run))


@EXAMPLES
@given(
    tokens=NUMBERS,
    total_time=NUMBERS,
    stamp=STAMPS,
    model=TEXT,
    result=NUMBERS,
)
def test_import_inspect_with_hostile_values(base, tokens, total_time, stamp, model, result):
    """Values Inspect's own reader lets through reach our checks; the others it refuses (its
    refusal is ours too: bad input, one line)."""
    with fresh(base) as (store, tmp):
        log = json.loads(base["inspect"].read_text())
        sample = log["samples"][0]
        sample["total_time"] = total_time
        sample["started_at"] = stamp
        for ev in sample["events"]:
            if ev.get("event") == "model":
                ev["output"]["usage"]["input_tokens"] = tokens
                ev["output"]["model"] = model
            if ev.get("event") == "sandbox":
                ev["result"] = result
        path = tmp / "log.json"
        path.write_text(json.dumps(log), encoding="utf-8", errors="surrogatepass")
        _import_checked(store, "inspect", str(path))


def _other_store(tmp: Path, run_dir: bytes, seed: int) -> Path:
    """A store whose one run folder is named ``run_dir`` (any bytes): a generated run of that id
    when it is one, else one renamed there (its events then name another run)."""
    other = tmp / "other"
    run_id = run_dir.decode() if run_dir in (b"rec-1", b"imp-1") else "x-1"
    generate_run(other, run_id, seed=seed, calls=1)
    spool = os.fsencode(other / "spool")
    try:
        os.rename(spool + b"/" + run_id.encode(), spool + b"/" + run_dir)
    except OSError:
        pass  # a name the file system refuses: the run keeps its own
    return other


@EXAMPLES
@given(run_dir=st.one_of(st.just(b"rec-1"), st.just(b"imp-1"), NAME_BYTES), seed=st.integers(1, 3))
def test_ingest_from_a_store_with_hostile_and_taken_run_ids(base, run_dir, seed):
    """Another store whose run folder has any name, or the name of a run the store holds (the same
    run when seed is 1 and the name rec-1, another run otherwise)."""
    with fresh(base) as (store, tmp):
        other = _other_store(tmp, run_dir, seed)
        before_files, before = files(store), event_hashes(store)
        r = amb("ingest", "--store", str(store), "--from", str(other))
        check(store, r, (0, 1, 2))
        after = event_hashes(store)
        assert {run: after.get(run) for run in before} == before
        if r.exit_code != 0:
            assert files(store) == before_files
        if run_dir in (b"rec-1", b"imp-1") and (seed, run_dir) != (1, b"rec-1"):
            assert r.exit_code == 2 and "already exists" in r.stderr, r.stderr


@EXAMPLES
@given(
    # Out of range whatever the seed: from seed 0, a million runs (seeds 0..999,999) is a valid request.
    runs=st.one_of(st.integers(-(2**70), 0), st.integers(1, 2), st.integers(10**6 + 2, 2**70)),
    calls=st.one_of(st.integers(-(2**70), 0), st.integers(1, 2), st.integers(10_001, 2**70)),
    seed=st.one_of(st.integers(-(2**70), -1), st.integers(0, 3), st.integers(999_999, 2**70)),
    prefix=st.one_of(st.just("synth"), TEXT),
)
def test_generate_with_hostile_numbers_and_prefixes(base, runs, calls, seed, prefix):
    """Counts and seeds out of range, prefixes that make no run id, ids the store holds (synth-0002)."""
    with fresh(base) as (store, _):
        before_files, before = files(store), event_hashes(store)
        r = amb(
            "generate", "--store", str(store), "--runs", str(runs), "--calls", str(calls),
            "--seed", str(seed), "--prefix", prefix,
        )  # fmt: skip
        if r.exit_code == 0:
            assert amb("ingest", "--store", str(store)).exit_code == 0
        check(store, r)
        after = event_hashes(store)
        assert {run: after.get(run) for run in before} == before
        if r.exit_code == 2:
            assert files(store) == before_files
        if prefix == "synth" and 0 <= seed <= 2 < seed + runs <= 3 and 1 <= calls <= 10_000:
            assert r.exit_code == 2 and "'synth-0002' already exists" in r.stderr
