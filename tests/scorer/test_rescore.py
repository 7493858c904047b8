"""Rescoring recorded runs: identical rows twice; a one-item rubric change moves only what it affects."""

from __future__ import annotations

import json
import shutil

import pytest

from recorder.synthetic import generate_run
from replay.blob_migrate import migrate
from replay.ingest import ingest
from schemas.blobstore import BlobStore
from scorer import ledger
from scorer.batch import open_store, score_runs
from scorer.profile import load
from tests.fakes import judge_server as fake
from tests.fakes.old_store import explode

N_RUNS = 20
"""Synthetic runs cycle through one task per track and alternate tiers (``recorder.synthetic``):
20 runs hold every track at both tiers twice, which is all the rubric change below can tell apart."""
LLM_RUNS = [f"run-{i:03d}" for i in range(N_RUNS)]
"""The LLM judge part asks ~10 items per run over real HTTP, for every run."""
CONTENT = ("s1a", "s1b", "s1c", "s1d", "s1e", "s1f", "s2a", "s2b", "s2c", "s2d", "s2e", "s3")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("rescore") / "store"
    for i in range(N_RUNS):
        generate_run(root, f"run-{i:03d}", seed=i, calls=12)
    ingest(root)
    return root


def _asked(requests: list[dict]) -> int:
    """The different requests the judge server got: a request the client sent again (the SDK retries
    one whose connection broke, as a loaded machine can make it) is one question asked."""
    return len({json.dumps(r, sort_keys=True) for r in requests})


def _key(row):
    return {k: v for k, v in row.items() if k not in ("batch_id", "scored_at")}


def test_offline_rescore_is_identical_and_appends(store):
    prof = load("paper-2026-06")
    with open_store(store) as st:
        a = score_runs(st, prof, judge="offline", jobs=2)
        b = score_runs(st, prof, judge="offline", jobs=2)
        n_rows = st.con.execute("SELECT count(*) FROM scores").fetchall()[0][0]
        current = ledger.current(st.con, profile_id=prof.id)
    assert len(a.rows) == N_RUNS and a.judge == "offline:rules-v1"
    assert {(r["track"], r["tier"]) for r in a.rows} == {
        (t, tier)
        for t in ("segmentation", "enhancement", "vqa", "report", "detection")
        for tier in ("lite", "standard")
    }
    assert [r["fingerprint"] for r in a.rows] == [r["fingerprint"] for r in b.rows]
    assert a.rows == b.rows
    assert n_rows >= 2 * N_RUNS  # appended, never overwritten
    assert len(current) == N_RUNS and {r["batch_id"] for r in current} == {b.batch_id}
    assert [_key(r) for r in current] == [_key(r) for r in sorted(b.rows, key=lambda r: r["run_id"])]


def test_rows_handed_a_chunk_at_a_time_under_a_small_database_memory(store, monkeypatch, memory_growth):
    """Scored in chunks of 3, with a database memory limit too small for a chunk at first: each
    chunk is scored again with twice the limit, every row is handed on once and in order (none
    kept: ``keep_rows=False``), the ledger holds each once, and they are the rows of a plain
    scoring."""
    from scorer import batch

    prof = load("paper-2026-06")
    with open_store(store) as st:
        plain = score_runs(st, prof, judge="offline", jobs=2)
        monkeypatch.setattr(batch, "SCORE_MEMORY", 1 << 16)
        handed: list[list[dict]] = []
        small = score_runs(st, prof, judge="offline", jobs=2, chunk=3, keep_rows=False, on_rows=handed.append)
        stored = ledger.current(st.con, profile_id=prof.id)
    assert memory_growth, "the first limit was enough: the retry was not reached"
    assert small.rows == [] and [len(h) for h in handed] == [3] * 6 + [2]
    rows = [r for h in handed for r in h]
    assert [_key(r) for r in rows] == [_key(r) for r in plain.rows]
    assert {r["batch_id"] for r in stored} == {small.batch_id} and len(stored) == N_RUNS


def test_a_migrated_store_scores_the_same(store, tmp_path):
    """The store as an old amb left it (one loose file per blob), moved to packs by
    ``amb blobs migrate``: every score is the one the packed store gives."""
    old = tmp_path / "old"
    shutil.copytree(store, old, symlinks=True)
    blobs = BlobStore(old / "blobs")
    assert explode(blobs) > 0
    assert migrate(blobs).bad == [] and list(blobs.loose_files()) == []
    blobs.close()
    prof = load("paper-2026-06")
    runs = LLM_RUNS[:5]  # one per track
    with open_store(store) as st:
        packed = score_runs(st, prof, run_ids=runs, judge="offline", jobs=2)
    with open_store(old) as st:
        migrated = score_runs(st, prof, run_ids=runs, judge="offline", jobs=2)
    assert [_key(r) for r in migrated.rows] == [_key(r) for r in packed.rows] and len(packed.rows) == 5


def test_llm_rubric_change_reasks_only_affected_pairs(store, monkeypatch, tmp_path):
    def policy(req):
        text = fake.user_text(req)
        if text.startswith("Error codes for this run"):
            first_id = text.split("\n[", 1)[1].split("]", 1)[0]
            return fake.Reply(
                content=f'{{"codes": [{{"code": "E3", "evidence": ["{first_id}"], "reason": "fake"}}]}}'
            )
        item = fake.asked_item(req)
        if "STRICT" in text:
            return fake.verdict(item, 0)
        return fake.verdict(item, 0.5 if item == "s3" else 1)

    with fake.JudgeServer(policy) as server:
        monkeypatch.setenv("AMB_JUDGE_BASE_URL", server.base_url)
        monkeypatch.setenv("AMB_JUDGE_MODEL", "fake-judge")
        base = load("paper-2026-06")
        with open_store(store) as st:
            first = score_runs(st, base, judge="llm", jobs=4, run_ids=LLM_RUNS)
            judged_pairs = sum(1 for r in first.rows for i in r["details"]["items"] if i["call_key"])
            # One call per judged (run, item) pair, plus one error-code call per run.
            assert first.judge_requests == _asked(server.requests) == judged_pairs + len(first.rows)
            assert all("E3" in r["codes"] for r in first.rows)

            again = score_runs(st, base, judge="llm", jobs=4, run_ids=LLM_RUNS)
            assert again.judge_requests == 0 and _asked(server.requests) == first.judge_requests
            assert [r["fingerprint"] for r in again.rows] == [r["fingerprint"] for r in first.rows]

            # One item changes: the detection variant of s1c.
            changed = tmp_path / "strict.toml"
            changed.write_text(
                'extends = "paper-2026-06"\n[[rubric]]\nid = "s1c"\nstage = "S1"\ntracks = ["detection"]\n'
                'text = "STRICT: the detector must output boxes for every class."\nvalues = [0, 1]\n'
                'rule = "plan_target"\nrequires = "s1a"\n'
            )
            strict = load(str(changed))
            before = _asked(server.requests)
            third = score_runs(st, strict, judge="llm", jobs=4, run_ids=LLM_RUNS)
        affected = [
            r
            for r in first.rows
            if r["track"] == "detection"
            and any(i["id"] == "s1c" and i["call_key"] for i in r["details"]["items"])
        ]
        assert third.judge_requests == _asked(server.requests) - before == len(affected) > 0
    old = {r["run_id"]: r for r in first.rows}
    moved = set()
    for r in third.rows:
        o = old[r["run_id"]]
        for k in ("s2", "s3", "s4", "s5", "task_score"):
            assert r[k] == o[k], (r["run_id"], k)
        if r["s1"] != o["s1"]:
            moved.add(r["run_id"])
    assert moved == {r["run_id"] for r in affected if r["s1"] is not None}


def test_runs_read_a_few_by_a_query_score_as_each_alone(store, monkeypatch):
    """Runs asked in any order, with gaps, and read 4 by a query: each row is the one its run gets
    scored alone, in the order asked."""
    from scorer import batch

    prof = load("paper-2026-06")
    asked = [LLM_RUNS[i] for i in (13, 2, 7, 19, 0, 8, 15, 4, 11)]
    with open_store(store) as st:
        alone = [score_runs(st, prof, run_ids=[r], judge="offline").rows[0] for r in asked]
        monkeypatch.setattr(batch, "READ_RUNS", 4)
        together = score_runs(st, prof, run_ids=asked, judge="offline", jobs=2)
    assert [r["run_id"] for r in together.rows] == asked
    assert [_key(r) for r in together.rows] == [_key(r) for r in alone]


def test_the_judge_cache_is_held_a_chunk_of_runs_at_a_time(store, monkeypatch):
    """Rescoring with every verdict cached asks nothing, while the cache holds only the records of
    the chunk's runs (not the store's); a key of a run outside the chunk is read when asked."""
    from scorer.judge.cache import JudgeCache

    runs = LLM_RUNS[:7]
    held: list[int] = []
    load_runs = JudgeCache.load_runs

    def counted(cache: JudgeCache, run_ids: list[str]) -> None:
        load_runs(cache, run_ids)
        held.append(len(cache._entries))

    with fake.JudgeServer(fake.default_policy) as server:
        monkeypatch.setenv("AMB_JUDGE_BASE_URL", server.base_url)
        monkeypatch.setenv("AMB_JUDGE_MODEL", "fake-judge")
        prof = load("paper-2026-06")
        with open_store(store) as st:
            first = score_runs(st, prof, judge="llm", jobs=2, run_ids=runs)
            monkeypatch.setattr(JudgeCache, "load_runs", counted)
            again = score_runs(st, prof, judge="llm", jobs=2, run_ids=runs, chunk=2)
            calls = st.con.execute(
                "SELECT run_id, key FROM judge_calls WHERE cacheable AND model = 'fake-judge' ORDER BY run_id"
            ).fetchall()
            stored = ledger.StoredCalls(st.con, "fake-judge")
            cache = JudgeCache(stored=stored)
            cache.load_runs(runs[:1])
            other = next(key for run, key in calls if run == runs[-1])
            hit = cache.get(other)
    assert again.judge_requests == 0 and calls  # (the first asked, here or in a test before)
    assert [_key(r) for r in again.rows] == [_key(r) for r in first.rows]
    per_run = {run: sum(1 for r, _ in calls if r == run) for run in runs}
    assert held and max(held) <= 2 * max(per_run.values()) < len(calls)
    assert hit is not None and hit.key == other and hit.run_id == runs[-1]
    assert cache.get("sha256:" + "0" * 64) is None


def test_the_reports_rows_hold_its_columns_only_and_each_text_once(store):
    """``amb report`` reads the few columns its views use, not each run's rubric items (``details``,
    ten times the rest of a row), and the texts every row repeats (model, track, judge, reasons)
    are kept once: what it holds per run is a fraction of the full row."""
    from scorer import report

    prof = load("paper-2026-06")
    with open_store(store) as st:
        judge = score_runs(st, prof, judge="offline", jobs=2).judge
        full = ledger.current(st.con, profile_id=prof.id, judge=judge)
        slim = ledger.current(st.con, profile_id=prof.id, judge=judge, columns=report.COLUMNS)
    assert [set(r) for r in slim] == [{*report.COLUMNS, "batch_id", "scored_at"}] * N_RUNS
    assert slim == [{k: r[k] for k in slim[0]} for r in full]
    same_track = [r for r in slim if r["track"] == slim[0]["track"]]
    assert len(same_track) > 1 and all(r["track"] is same_track[0]["track"] for r in same_track)
    texts = [v for r in slim for v in (r["reasons"] or {}).values()]
    assert len(texts) > len(set(texts)) and len({id(t) for t in texts}) == len(set(texts))


def test_a_batch_leaves_its_rows_checkpointed(store):
    """A batch moves its rows from the write-ahead log into the file before it returns, under the
    scoring's small memory limit: left to the store's close, that checkpoint ran with no limit."""
    from replay.store import DB_NAME

    wal = store / (DB_NAME + ".wal")
    prof = load("paper-2026-06")
    with open_store(store) as st:
        score_runs(st, prof, judge="offline", jobs=2, chunk=7)
        left = wal.stat().st_size if wal.exists() else 0
        limit = st.con.execute("SELECT current_setting('memory_limit')").fetchone()
        assert st.con.execute("SELECT count(*) FROM score_batches").fetchall()[0][0] >= 1
    assert left == 0, f"{left} bytes of the batch left in the log"
    assert limit is not None and "GiB" in limit[0]  # the limit is back to the default
