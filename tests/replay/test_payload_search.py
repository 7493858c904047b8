"""Payload search (replay.search): the pattern finds exactly what lowering every payload found, on
hostile strings, for every character DuckDB's lower changes, and for queries RE2 would read as
syntax; the assumptions it rests on hold for this DuckDB."""

from __future__ import annotations

import pytest

from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay import search
from replay.ingest import ingest
from replay.store import open_sql
from replay.web import events
from schemas.events import Note, RunFinished, RunStarted, ToolCallRequested

# Texts an agent could write: LIKE and regular-expression syntax, quotes, backslashes and JSON
# escapes, whitespace, and letters whose case mapping is not one ASCII letter to another (German
# sharp s, Turkish dotted and dotless i, the Kelvin sign, final sigma, a ligature, titlecase
# digraphs, combining accents, emoji, full width).
TEXTS = [
    "100% DONE_ok",
    "100 percent done",
    "it's \"QUOTED\" and 'Single'",
    "C:\\Users\\AGENT\\x.TXT",
    "[a-z]+ ^START$ (x|y){2} .* a\\d",
    "tab\there\nnew line",
    "Straße STRASSE straße",
    "İstanbul ISTANBUL ıi",
    "KELVIN 5\u212a and 5k",
    "ΣΊΣΥΦΟΣ σίσυφος ς",
    "ﬁle FILE ǅemal Ǆ",
    "Cafe\u0301 CAFÉ café",
    "🙂 SMILE 🙂",
    "ＦＵＬＬ ｗｉｄｔｈ",
    "<script>ALERT(1)</script>",
    "sys.exit(1) Traceback (most recent call last)",
    "plain lower case only",
]
QUERIES = [
    "%",
    "_",
    "%_",
    "100%",
    "done_",
    "'",
    '"quoted"',
    "\\users\\",
    "\\\\",
    "[a-z]",
    "a-z",
    "^start$",
    "(x|y){2}",
    ".*",
    "a\\d",
    "\\x{41}",
    "]",
    "^",
    "-",
    "\t",
    "\n",
    "\\n",
    "straße",
    "STRASSE",
    "ß",
    "İ",
    "i̇",
    "ı",
    "istanbul",
    "\u212a",
    "5k",
    "σίσυφος",
    "ΣΊΣΥΦΟΣ",
    "ς",
    "ﬁ",
    "FILE",
    "ǅ",
    "ǆ",
    "é",
    "É",
    "e\u0301",
    "🙂",
    "ｆｕｌｌ",
    "<SCRIPT>",
    "SYS.EXIT(1)",
    "tool_call_id",
    "no such text anywhere",
    " ",
    "x" * (search.MAX_QUERY + 1),
]
RUN = "hostile-search"


def _hostile_run(root) -> None:
    rec = SpoolWriter(spool_path(root, RUN, "recorder"), RUN, "recorder", sync=False)
    rec.append(RunStarted(model="M", task="T"))
    for i, text in enumerate(TEXTS):
        rec.append(Note(text=text, data={"Key": text.upper(), "n": i}))
        rec.append(ToolCallRequested(tool_call_id=f"ID-{i}", name="Run", arguments=text, model_call_id="c"))
    rec.append(RunFinished(status="completed", exit_code=0))
    rec.close()


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    root = tmp_path_factory.mktemp("search") / "store"
    _hostile_run(root)
    generate_run(root, "synthetic", seed=1, calls=6)
    ingest(root, spool_mode="keep")
    con = open_sql(root)
    yield con
    con.close()


def _old(con, run_id: str, q: str) -> list[str]:
    """The search as it was: every payload lowered at each search."""
    rows = con.execute(
        "SELECT source, seq FROM events WHERE run_id = ? "
        "AND contains(lower(CAST(payload AS VARCHAR)), lower(?)) ORDER BY ts_ns, source, seq",
        [run_id, q],
    ).fetchall()
    return [f"{s}:{n}" for s, n in rows]


def _viewer(con, run_id: str, q: str) -> list[str]:
    page = events.events_page(con, run_id, events.EventsQuery(limit=500, q=q))
    assert page.next is None
    return [e.key for e in page.events]


def test_search_finds_what_lowering_every_payload_found(con):
    hits = 0
    for run_id in (RUN, "synthetic"):
        for q in QUERIES:
            expected = _old(con, run_id, q)
            assert _viewer(con, run_id, q) == expected, (run_id, q)
            hits += bool(expected)
    # The comparison means something: most queries find events, some find none.
    assert 30 < hits < 2 * len(QUERIES)
    # Case folds where DuckDB's lower folds (the Kelvin sign lowers to k), wildcards and regular
    # expression syntax are plain characters.
    assert _viewer(con, RUN, "straße") == _viewer(con, RUN, "STRASSE") == _old(con, RUN, "strasse")
    assert _viewer(con, RUN, "5k") == _viewer(con, RUN, "5\u212a") != []
    assert len(_viewer(con, RUN, "100%")) == 2 and _viewer(con, RUN, "%") == _viewer(con, RUN, "100%")
    assert len(_viewer(con, RUN, "(x|y){2}")) == 2 and _viewer(con, RUN, ".*") == _viewer(
        con, RUN, "(x|y){2}"
    )


def test_queries_are_searched_by_pattern_and_long_ones_by_lowering(con):
    for q in QUERIES[:-1]:
        condition, arg = search.matches(con, q)
        assert condition.startswith("regexp_matches(") and arg != q or q.isdigit(), q
    assert search.matches(con, QUERIES[-1]) == (search.FALLBACK, QUERIES[-1])
    assert search.pattern(con, "Kelvin") == "[Kk\\x{212a}][Ee][Ll][Vv][Ii\\x{130}][Nn]"


def test_characters_lower_changes_are_found_both_ways(con):
    """Characters DuckDB's lower changes, and what they lower to, searched for among all of them:
    the pattern agrees with lowering. Every character that more than one lowers to (k: K and the
    Kelvin sign) and those it comes from, and every tenth of the rest (all of them: ~45 s)."""
    pairs = con.execute(
        f"""SELECT chr(i::INTEGER), lower(chr(i::INTEGER)) FROM range(1, {search.CASED_BELOW}) AS t(i)
            WHERE (i < 55296 OR i > 57343) AND lower(chr(i::INTEGER)) <> chr(i::INTEGER)"""
    ).fetchall()
    assert len(pairs) > 1000
    texts = sorted({c for pair in pairs for c in pair})
    con.execute("CREATE OR REPLACE TEMP TABLE cased (t VARCHAR)")
    con.executemany("INSERT INTO cased VALUES (?)", [[f"<{t}>"] for t in texts])
    shared = {low for low, sources in search.lowered_from(con).items() if len(sources) > 1}
    assert {"k", "i"} <= shared
    queries = shared | {c for c, low in pairs if low in shared} | set(texts[::10])
    for q in sorted(queries):
        condition, arg = search.matches(con, f"<{q}>")
        assert condition.startswith("regexp_matches(")
        found = con.execute(
            f"""SELECT count(*) FILTER (WHERE {condition.replace("payload", "t")}),
                       count(*) FILTER (WHERE contains(lower(t), lower(?)))
                FROM cased""",
            [arg, f"<{q}>"],
        ).fetchall()[0]
        assert found[0] == found[1] >= 1, q


def test_the_assumptions_hold_for_this_duckdb(con):
    """lower maps one code point to one, and changes none at or above CASED_BELOW (a DuckDB whose
    lower did otherwise would make search fall back to lowering, or miss: this says which)."""
    assert search.lowered_from(con)
    above = con.execute(
        f"""SELECT count(*) FROM range({search.CASED_BELOW}, 1114112) AS t(i)
            WHERE lower(chr(i::INTEGER)) <> chr(i::INTEGER)"""
    ).fetchall()[0][0]
    assert above == 0
