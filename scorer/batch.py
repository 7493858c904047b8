"""Scoring many runs: read events, score in parallel, append to the ledger in bulk chunks.

Memory stays flat: runs are scored in chunks, and each chunk's rows, judge calls, new grades and
built-in audit scanner rows are appended before the next one starts. Workers are threads: LLM judge
calls overlap, and numpy grading releases the GIL. The store is opened read-write once (DuckDB
allows a single writer), so ``amb ingest`` and a scoring batch wait for each other.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import duckdb

from replay.bounded import DatabaseMemory
from replay.read import Row as EventRow
from replay.read import RowSpans, event_of, require_runs, row_spans, runs_rows
from replay.read import run_ids as all_run_ids
from replay.store import Store
from schemas.errors import UsageError
from schemas.score_row import ScoreRow
from scorer import ledger
from scorer.audit import Violation
from scorer.cost import load_table
from scorer.evidence import Evidence
from scorer.judge.cache import JudgeCache
from scorer.judge.llm import LLMJudge, endpoint
from scorer.judge.offline import OfflineJudge
from scorer.migrations import MIGRATIONS
from scorer.pipeline import RunScorer
from scorer.profile import LoadedProfile
from scorer.scan_results import Row
from scorer.scan_results import append as append_scan
from scorer.scan_results import register as register_scanner
from scorer.scanners import Scanner, audit_findings, audit_scanner

SCORE_MEMORY = 32 << 20
"""The database's memory limit while runs are scored: each run's events are read once, a few runs
by a query, so the cache of the file needs little (``replay.bounded``)."""

READ_RUNS = 25
"""Runs whose events one query reads (``replay.read.runs_rows``, by the row groups between their
first and last rows); a few dozen runs' events are a few MB."""


class BatchResult(NamedTuple):
    batch_id: str
    rows: list[dict[str, Any]]
    judge: str
    judge_requests: int
    repeats: list[BatchResult] = []
    """With ``repeat > 1``: the batches of repeats 1..N-1 (their rows carry judge ``<label>#r<i>``)."""
    stability: dict[str, Any] | None = None
    """With ``repeat > 1``: per-item agreement, alpha and flips, and the S1–S3/AGENTIC spread."""


def open_store(store: str | Path | None) -> Store:
    """The store, read-write, with the scorer's tables migrated; it must exist (runs are scored
    once ingested, and a mistyped path is not made a new, empty store)."""
    return Store.open(store, extra_migrations=MIGRATIONS, create=False)


def default_judge(profile: LoadedProfile) -> str:
    """``llm`` when an endpoint is configured (environment or profile), else ``offline``."""
    return "llm" if endpoint(profile.profile.judge) is not None else "offline"


def make_judge(kind: str, profile: LoadedProfile, st: Store, cache: JudgeCache | None, repeat: int = 0):
    if kind == "offline":
        return OfflineJudge(st.blobs.get)
    if kind == "llm":
        assert cache is not None

        def put_evidence(e: Evidence) -> None:
            st.blobs.put(e.text.encode(), "text/plain; charset=utf-8", sync=False)

        return LLMJudge(
            profile.profile.judge, cache, put_evidence, images=profile.profile.evidence.images, repeat=repeat
        )
    raise UsageError(f"--judge must be offline or llm, not {kind!r}")


def score_runs(
    st: Store,
    profile: LoadedProfile,
    *,
    run_ids: list[str] | None = None,
    judge: str | None = None,
    references: Path | None = None,
    jobs: int = 2,
    chunk: int = 100,
    progress: Callable[[int], None] | None = None,
    args: dict[str, Any] | None = None,
    keep_rows: bool = True,
    repeat: int = 1,
    on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
) -> BatchResult:
    """Score runs under ``profile``; with ``repeat = N > 1`` (LLM judge only) every rubric item is
    asked N times, each repeat cached and stored on its own, and the result carries the judge's
    stability (``scorer.judge_stability``).

    ``on_rows`` is handed each chunk's rows (of the first repeat) once they are in the ledger: a
    caller that shows them as they come keeps none, with ``keep_rows=False``."""
    if repeat < 1:
        raise UsageError("--repeat must be at least 1")
    kind = judge or default_judge(profile)
    if repeat > 1 and kind != "llm":
        raise UsageError("--repeat N > 1 measures an LLM judge: use it with --judge llm")
    results = [
        _score_once(
            st,
            profile,
            run_ids=run_ids,
            kind=kind,
            references=references,
            jobs=jobs,
            chunk=chunk,
            progress=progress,
            args={**(args or {}), **({"repeat_index": r} if repeat > 1 else {})},
            keep_rows=keep_rows or repeat > 1,
            repeat_index=r,
            on_rows=on_rows if r == 0 else None,
        )
        for r in range(repeat)
    ]
    if repeat == 1:
        return results[0]
    from scorer import judge_stability

    rows_by_repeat = [r.rows for r in results]
    stability = {
        "repeats": repeat,
        "judges": [r.judge for r in results],
        **judge_stability.agreement_table(rows_by_repeat),
        "spread": judge_stability.spread(rows_by_repeat),
    }
    return results[0]._replace(repeats=results[1:], stability=stability)


def _audit_rows(audit: Scanner, rows: list[ScoreRow]) -> list[Row]:
    """The audit scanner's rows for scored runs: scoring audited them with the profile's rules, and
    its violations are the scanner's findings (``amb scan audit`` then skips these runs)."""
    return [
        Row(audit, r.run_id, audit_findings([Violation(**v) for v in r.details["violations"]])) for r in rows
    ]


def _score_and_append(
    pool: ThreadPoolExecutor,
    con: duckdb.DuckDBPyConnection,
    scorer: RunScorer,
    part: list[str],
    spans: RowSpans,
    batch_id: str,
    seq: int,
) -> list[ScoreRow]:
    """``part``'s rows scored, its runs' events read ``READ_RUNS`` at a time, and written in one
    insert (a part that runs short of memory wrote nothing)."""

    def one(run: tuple[str, list[EventRow]]) -> ScoreRow:
        return scorer.score(run[0], [event_of(row) for row in run[1]])

    rows: list[ScoreRow] = []
    for at in range(0, len(part), READ_RUNS):
        some = part[at : at + READ_RUNS]
        stored = runs_rows(con, some, spans=spans)
        rows += pool.map(one, [(run_id, stored.pop(run_id, [])) for run_id in some])
    ledger.append_rows(con, batch_id, rows, seq)
    return rows


def _score_once(
    st: Store,
    profile: LoadedProfile,
    *,
    run_ids: list[str] | None,
    kind: str,
    references: Path | None,
    jobs: int,
    chunk: int,
    progress: Callable[[int], None] | None,
    args: dict[str, Any],
    keep_rows: bool,
    repeat_index: int,
    on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
) -> BatchResult:
    con = st.con
    run_ids = all_run_ids(con) if run_ids is None else require_runs(con, run_ids, st.root)
    cache = None
    if kind == "llm":
        ep = endpoint(profile.profile.judge)
        cache = JudgeCache(stored=ledger.StoredCalls(con, ep[2] if ep else ""))
    the_judge = make_judge(kind, profile, st, cache, repeat_index)
    prices = load_table(profile.profile.cost.price_table)
    grade_cache = ledger.load_grade_cache(con)
    known_grades = set(grade_cache)
    scorer = RunScorer(
        profile, the_judge, st.blobs.get, prices, references=references, grade_cache=grade_cache
    )
    ledger.register_profile(con, profile)
    audit = audit_scanner(profile.profile.audit)
    register_scanner(con, audit)
    batch_id = ledger.new_batch_id()
    started = ledger.now()

    rows: list[dict[str, Any]] = []
    seq = 0
    # The database's cache of the file kept small while the runs are read (``replay.bounded``):
    # left alone it ends holding every run's events. A chunk that runs short of memory is
    # scored again with twice the limit (nothing of it was written: its rows go in last).
    spans = row_spans(con)  # (scoring writes no events: the spans hold to the end)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, DatabaseMemory(con, SCORE_MEMORY) as memory:
        for start in range(0, len(run_ids), chunk):
            part = run_ids[start : start + chunk]
            if cache is not None:
                cache.load_runs(part)
            chunk_rows = memory.retrying(
                partial(_score_and_append, pool, con, scorer, part, spans, batch_id, seq)
            )
            append_scan(con, batch_id, _audit_rows(audit, chunk_rows))
            seq += len(chunk_rows)
            if cache is not None:
                ledger.append_judge_calls(con, cache.drain())
            new = {k: v for k, v in grade_cache.items() if k not in known_grades}
            ledger.append_grades(con, new)
            known_grades.update(new)
            if keep_rows or on_rows:
                as_dicts = [r.as_dict() for r in chunk_rows]
                if keep_rows:
                    rows += as_dicts
                if on_rows:
                    on_rows(as_dicts)
            if progress:
                progress(len(part))
        requests = getattr(the_judge, "requests", 0)
        ledger.append_batch(con, batch_id, profile, the_judge.label, started, seq, requests, args or {})
        memory.checkpoint()
    return BatchResult(batch_id, rows, the_judge.label, requests)
