"""The SQL of ``amb ingest`` (``replay.ingest``): the bulk statement that reads, checks and stores
every event of a batch of spools, and the checks that run on what it stored.

The statement reads the batch's frames files (``$batch``: one ``INDEX TAB LENGTH TAB SHA256 TAB
BODY`` line per event, written by ``replay.ingest_frames``) with DuckDB's CSV reader and checks each
event in the streaming ``INSERT ... SELECT``; a failed check raises through DuckDB's ``error()``.
The spools' keys, runs and sources are list parameters (``$keys``, ``$runs``, ``$sources``) indexed
by INDEX; ``_amb_files`` (the batch's spools) is a temporary table the caller makes.
"""

from __future__ import annotations

from replay import hot
from schemas.codec import GENESIS
from schemas.events import KINDS
from schemas.frames import MAX_BODY

_KINDS = ", ".join(
    f"""('{kind}', {cls.VERSION}, '{{"kind":"{kind}","payload":')""" for kind, cls in sorted(KINDS.items())
)
"""Each known kind, the newest version this amb reads, and how its canonical body begins."""

_HOT_NAMES = ", ".join(c.name for c in hot.HOT_COLUMNS)
_HOT_PATHS = ", ".join(f"'$.payload.{c.path}'" for c in hot.HOT_COLUMNS)
_HOT_FROM_BODY = "".join(f", {hot.cast(f'x[{8 + i}]', c)} AS {c.name}" for i, c in enumerate(hot.HOT_COLUMNS))
"""The hot columns, from the same parse of each body that reads its envelope (``replay.hot``)."""

_INSERT = f"""
INSERT INTO events (run_id, source, seq, kind, v, ts_ns, payload, prev_hash, hash, {_HOT_NAMES})
SELECT run_id, source, seq, kind, v, ts_ns, payload, prev_hash,
       CASE WHEN bad IS NOT NULL
                THEN error(concat('spool ', $keys[file + 1], ': seq ', coalesce(seq_text, '?'), ': ', bad))
            WHEN stored IS NOT NULL AND stored <> hash
                THEN error(concat('CONFLICT spool ', $keys[file + 1], ': seq ', seq_text,
                     ': the spool differs from the event already stored under this key',
                     ' (forked or edited spool)'))
            ELSE hash END,
       {_HOT_NAMES}
FROM (
    SELECT p.*, {{stored_hash}} AS stored,
           CASE WHEN strlen(p.body) <> p.len THEN 'frame length mismatch'
                WHEN p.run_id IS DISTINCT FROM $runs[p.file + 1]
                  OR p.source IS DISTINCT FROM $sources[p.file + 1]
                    THEN 'event belongs to ' || coalesce(p.run_id, '?') || '/' || coalesce(p.source, '?')
                WHEN k.max_v IS NULL THEN 'UNKNOWN unknown event kind ' || coalesce(p.kind, '?')
                WHEN p.v > k.max_v
                    THEN 'NEWER ' || p.kind || ' v' || p.v || ' is newer than this amb (v' || k.max_v
                         || '); upgrade amb'
                WHEN NOT starts_with(p.body, k.body_start)
                  OR NOT ends_with(p.body, p.tail_text) THEN 'not a canonical event body'
           END AS bad
    FROM (
        SELECT t.*,
               substr(t.body, length(t.kind) + 22,
                      length(t.body) - length(t.kind) - 21 - length(t.tail_text)) AS payload
        FROM (
            SELECT c.file, c.len, c.digest, c.body,
                   x[1] AS kind, x[2] AS prev_hash, x[3] AS run_id, x[4] AS seq_text,
                   TRY_CAST(x[4] AS BIGINT) AS seq,
                   x[5] AS source, TRY_CAST(x[6] AS BIGINT) AS ts_ns, TRY_CAST(x[7] AS INTEGER) AS v,
                   concat('sha256:', c.digest) AS hash{_HOT_FROM_BODY},
                   concat(',"prev_hash":"', x[2], '","run_id":"', x[3], '","seq":', TRY_CAST(x[4] AS BIGINT),
                          ',"source":"', x[5], '","ts_ns":', TRY_CAST(x[6] AS BIGINT),
                          ',"v":', TRY_CAST(x[7] AS INTEGER), '}}') AS tail_text
            FROM (
                SELECT file, len, digest, body,
                       json_extract_string(
                           body,
                           ['$.kind', '$.prev_hash', '$.run_id', '$.seq', '$.source', '$.ts_ns', '$.v',
                            {_HOT_PATHS}]
                       ) AS x
                FROM read_csv($batch, delim = '\t', quote = '', escape = '', header = false,
                              auto_detect = false, max_line_size = {2 * MAX_BODY},
                              columns = {{'file': 'BIGINT', 'len': 'BIGINT', 'digest': 'VARCHAR',
                                         'body': 'VARCHAR'}})
            ) AS c
        ) AS t
    ) AS p
    LEFT JOIN (VALUES {_KINDS}) AS k(kind, max_v, body_start) ON k.kind = p.kind
    {{stored_join}}
) AS checked
WHERE stored IS NULL OR stored <> hash
"""

_STORED_JOIN = """LEFT JOIN (
               SELECT run_id, source, seq, hash FROM events WHERE run_id IN (SELECT run_id FROM _amb_files)
           ) AS e ON e.run_id = p.run_id AND e.source = p.source AND e.seq = p.seq"""
"""Events already stored for the batch's runs: skipped if identical, a conflict if not. Left out
when none of the batch's runs has stored events (the usual first ingest), which saves a join."""

SEQUENCE_CHECK = """
SELECT run_id, source, n, n_distinct, lo, hi FROM (
    SELECT e.run_id, e.source, count(*) AS n, count(DISTINCT e.seq) AS n_distinct,
           min(e.seq) AS lo, max(e.seq) AS hi
    FROM events e SEMI JOIN _amb_files f ON f.run_id = e.run_id AND f.source = e.source
    GROUP BY ALL
) WHERE n <> n_distinct OR lo <> 0 OR hi <> n - 1
ORDER BY run_id, source LIMIT 1
"""

CHAIN_CHECK = f"""
SELECT s.run_id, s.source, s.seq FROM events s
SEMI JOIN _amb_files f ON f.run_id = s.run_id AND f.source = s.source
LEFT JOIN events p ON p.run_id = s.run_id AND p.source = s.source AND p.seq = s.seq - 1
WHERE s.prev_hash <> coalesce(p.hash, '{GENESIS}')
ORDER BY s.run_id, s.source, s.seq LIMIT 1
"""


def insert_sql(seen: bool) -> str:
    """The bulk statement; ``seen``: some of the batch's runs have stored events, which it then
    joins (skipping identical events, refusing different ones)."""
    return _INSERT.replace("{stored_join}", _STORED_JOIN if seen else "").replace(
        "{stored_hash}", "e.hash" if seen else "NULL::VARCHAR"
    )


RECORD_FILES = """
INSERT OR REPLACE INTO spool_files
SELECT f.key, f.run_id, f.source, f.size, coalesce(s.n, 0), s.last_hash, f.torn, now()
FROM _amb_all_files f
LEFT JOIN (SELECT e.run_id, e.source, count(*) AS n, arg_max(e.hash, e.seq) AS last_hash
           FROM events e SEMI JOIN _amb_all_files a ON a.run_id = e.run_id AND a.source = e.source
           GROUP BY ALL) s
  ON s.run_id = f.run_id AND s.source = f.source
"""
"""What ``spool_files`` records of each spool of the batch (``_amb_all_files``, torn or not)."""
