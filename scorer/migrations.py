"""The scorer's tables, applied by the store's migration runner (``replay.migrations.apply``).

Every table is append-only: a rescore adds rows, nothing is updated or deleted, and "the current
score" is a view. Names carry the ``scorer.`` prefix (migration names are global to the store).
"""

from __future__ import annotations

import duckdb

from replay.migrations import Migration

LATEST_FIRST = "scored_at DESC, batch_id DESC, seq DESC"
"""The order of one run's rows under a profile and judge, the current one first."""

# "Current" = the latest row per (run, profile, judge).
_CURRENT_VIEW = f"""VIEW scores_current AS
        SELECT * FROM scores
        QUALIFY row_number() OVER (
            PARTITION BY run_id, profile_id, judge ORDER BY {LATEST_FIRST}
        ) = 1
        """

_M001_STATEMENTS = (
    # One row per distinct profile content ever used; the id is the sha256 of the canonical content,
    # so the same rules loaded from two files are one profile.
    """
        CREATE TABLE score_profiles (
            profile_id  VARCHAR PRIMARY KEY,
            name        VARCHAR NOT NULL,
            content     JSON NOT NULL,
            first_used  TIMESTAMP NOT NULL
        )
        """,
    # One row per `amb score` invocation that wrote rows: what was asked, by which code version.
    """
        CREATE TABLE score_batches (
            batch_id     VARCHAR PRIMARY KEY,
            profile_id   VARCHAR NOT NULL,
            judge        VARCHAR NOT NULL,
            started_at   TIMESTAMP NOT NULL,
            finished_at  TIMESTAMP NOT NULL,
            runs         INTEGER NOT NULL,
            judge_requests INTEGER NOT NULL,
            amb_version  VARCHAR NOT NULL,
            args         JSON NOT NULL
        )
        """,
    # The ledger: one row per (run, profile, judge) per scoring batch. No primary key on purpose:
    # rescoring appends; `scores_current` picks the latest. Unscored values are NULL with the reason
    # in `reasons`, never 0.
    """
        CREATE TABLE scores (
            batch_id VARCHAR NOT NULL, seq INTEGER NOT NULL, scored_at TIMESTAMP NOT NULL,
            run_id VARCHAR NOT NULL, profile_id VARCHAR NOT NULL, profile_name VARCHAR NOT NULL,
            judge VARCHAR NOT NULL, agent VARCHAR, model VARCHAR, task VARCHAR, track VARCHAR,
            tier VARCHAR, repeat INTEGER,
            s1 DOUBLE, s2 DOUBLE, s3 DOUBLE, s4 DOUBLE, s5 DOUBLE,
            agentic DOUBLE, task_score DOUBLE, overall DOUBLE,
            status VARCHAR NOT NULL, audit_status VARCHAR NOT NULL,
            turns INTEGER, wall_s DOUBLE,
            tokens_in BIGINT, tokens_out BIGINT, tokens_cache_read BIGINT, tokens_cache_write BIGINT,
            tokens_reasoning BIGINT, cost_usd DOUBLE, cost_estimated BOOLEAN, price_table VARCHAR,
            codes VARCHAR[], n_violations INTEGER, reasons JSON, details JSON,
            evidence_sha256 VARCHAR, fingerprint VARCHAR NOT NULL
        )
        """,
    # Every LLM judge exchange. The request stores the evidence by digest (the evidence text is a
    # blob); `cacheable` is false for transport failures, which are kept for the record but never
    # served as a cached verdict. Not unique by key: a retried timeout adds a second row. `codes` is
    # set on the per-run error-code call (item `codes`), NULL on rubric-item calls.
    """
        CREATE TABLE judge_calls (
            key VARCHAR NOT NULL, model VARCHAR NOT NULL, settings JSON NOT NULL, item VARCHAR NOT NULL,
            run_id VARCHAR NOT NULL, evidence_sha256 VARCHAR NOT NULL, request JSON NOT NULL,
            response VARCHAR NOT NULL, reply_text VARCHAR NOT NULL, value DOUBLE, reason VARCHAR,
            cited JSON, unscored_reason VARCHAR, cacheable BOOLEAN NOT NULL, latency_ms DOUBLE,
            created_at TIMESTAMP NOT NULL, codes JSON
        )
        """,
    # Grades are pure functions of (spec, submission digests, reference digest, metric options);
    # keyed by the hash of those so a rescore never re-reads a mask it has graded.
    """
        CREATE TABLE grade_cache (
            key VARCHAR PRIMARY KEY, summary JSON NOT NULL, created_at TIMESTAMP NOT NULL
        )
        """,
    "CREATE " + _CURRENT_VIEW,
)


def _m001_tables(con: duckdb.DuckDBPyConnection) -> None:
    for statement in _M001_STATEMENTS:
        con.execute(statement)


def _m002_medal_rating(con: duckdb.DuckDBPyConnection) -> None:
    # The branches' medal tier and rating (scorer.medal), two more ScoreRow fields. Rows written
    # before this migration keep NULL: they were not assessed, which is not the same as "fail".
    con.execute("ALTER TABLE scores ADD COLUMN medal VARCHAR")
    con.execute("ALTER TABLE scores ADD COLUMN rating VARCHAR")
    # Rebind the view so `SELECT *` carries the new columns.
    con.execute("CREATE OR REPLACE " + _CURRENT_VIEW)


_M003_STATEMENTS = (
    # Scanners as profiles are kept: one row per distinct content (the id is its sha256).
    """CREATE TABLE scanners (scanner_id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL, kind VARCHAR NOT NULL,
        content JSON NOT NULL, first_used TIMESTAMP NOT NULL)""",
    # One row per (run, scanner version) per scan; a run already scanned by a version is skipped, so a
    # rerun adds nothing. `error` is set (and the findings empty) when the scanner failed on that run.
    """CREATE TABLE scan_results (scan_id VARCHAR NOT NULL, scanner_id VARCHAR NOT NULL,
        scanner VARCHAR NOT NULL, run_id VARCHAR NOT NULL, scanned_at TIMESTAMP NOT NULL,
        n_findings INTEGER NOT NULL, value JSON, findings JSON NOT NULL, error VARCHAR)""",
    # "Current" = the latest row per (run, scanner name), whichever version wrote it.
    """CREATE VIEW scan_results_current AS SELECT * FROM scan_results QUALIFY row_number() OVER (
        PARTITION BY run_id, scanner ORDER BY scanned_at DESC, scan_id DESC) = 1""",
    # A person's judgements, append-only: `target` is `scanner:<name>`, `codes` or `item:<rubric id>`.
    """CREATE TABLE labels (label_set VARCHAR NOT NULL, run_id VARCHAR NOT NULL, target VARCHAR NOT NULL,
        value JSON NOT NULL, annotator VARCHAR, source_sha256 VARCHAR NOT NULL,
        imported_at TIMESTAMP NOT NULL)""",
)


def _m003_scans(con: duckdb.DuckDBPyConnection) -> None:
    for statement in _M003_STATEMENTS:
        con.execute(statement)


def _m004_answers(con: duckdb.DuckDBPyConnection) -> None:
    # A question's parsed answer (an LLM scanner's boolean, number, label or text), which neither the
    # rubric verdict's DOUBLE `value` nor the error `codes` can honestly hold.
    con.execute("ALTER TABLE judge_calls ADD COLUMN answer JSON")


MIGRATIONS: list[Migration] = [
    Migration("scorer.m001_tables", _m001_tables),
    Migration("scorer.m002_medal_rating", _m002_medal_rating),
    Migration("scorer.m003_scans", _m003_scans),
    Migration("scorer.m004_answers", _m004_answers),
]
