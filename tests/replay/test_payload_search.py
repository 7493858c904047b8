"""Payload search (replay.search): the lower-cased copy kept at ingest finds exactly what lowering
every payload at each search found, on hostile strings; the migration fills an older store the same
way ingest does; verify catches the copy edited apart from its payload."""

from __future__ import annotations

import pytest

from recorder.spool import SpoolWriter, spool_path
from recorder.synthetic import generate_run
from replay import search
from replay.ingest import ingest
from replay.store import Store, open_sql
from replay.verify import verify
from replay.web import api
from schemas.events import Note, RunFinished, RunStarted, ToolCallRequested

# Texts an agent could write: LIKE wildcards, quotes, backslashes and JSON escapes, and letters whose
# case mapping is not one ASCII letter to another (German sharp s, Turkish dotted and dotless i, the
# Kelvin sign, final sigma, a ligature, titlecase digraphs, combining accents, emoji, full width).
TEXTS = [
    "100% DONE_ok",
    "100 percent done",
    "it's \"QUOTED\" and 'Single'",
    "C:\\Users\\AGENT\\x.TXT",
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
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("search") / "store"
    _hostile_run(root)
    generate_run(root, "synthetic", seed=1, calls=6)
    ingest(root, spool_mode="keep")
    return root


def _old(con, run_id: str, q: str) -> list[str]:
    """The search as it was: every payload lowered at each search."""
    rows = con.execute(
        "SELECT source, seq FROM events WHERE run_id = ? "
        "AND contains(lower(CAST(payload AS VARCHAR)), lower(?)) ORDER BY ts_ns, source, seq",
        [run_id, q],
    ).fetchall()
    return [f"{s}:{n}" for s, n in rows]


def _viewer(con, run_id: str, q: str) -> list[str]:
    page = api.events_page(con, run_id, {"q": q, "limit": "500"})
    assert page["next"] is None
    return [e["key"] for e in page["events"]]


def test_search_finds_what_lowering_every_payload_found(store):
    con = open_sql(store)
    assert search.present(con) and "coalesce(" in search.matches(con)
    hits = 0
    for run_id in (RUN, "synthetic"):
        for q in QUERIES:
            expected = _old(con, run_id, q)
            assert _viewer(con, run_id, q) == expected, (run_id, q)
            hits += bool(expected)
    # The comparison means something: most queries find events, some find none.
    assert 20 < hits < 2 * len(QUERIES)
    # Case folds both ways where DuckDB's lower does, and wildcards are plain characters.
    assert _viewer(con, RUN, "straße") == _viewer(con, RUN, "STRASSE") == _old(con, RUN, "strasse")
    assert len(_viewer(con, RUN, "100%")) == 2 and _viewer(con, RUN, "%") == _viewer(con, RUN, "100%")
    con.close()


def test_the_copy_is_kept_only_where_the_payload_has_capitals(store):
    with Store.open(store) as st:
        rows = st.con.execute(
            f"SELECT CAST(payload AS VARCHAR), {search.COLUMN} FROM events WHERE run_id = ?", [RUN]
        ).fetchall()
        lowered = dict(
            st.con.execute(
                "SELECT CAST(payload AS VARCHAR), lower(CAST(payload AS VARCHAR)) "
                "FROM events WHERE run_id = ?",
                [RUN],
            ).fetchall()
        )
    kept = [(p, c) for p, c in rows if c is not None]
    assert kept and len(kept) < len(rows)  # the run's notes have capitals; some of its events none
    for payload, copy in rows:
        assert copy == (lowered[payload] if lowered[payload] != payload else None)


def test_migration_fills_an_older_store_as_ingest_does(tmp_path):
    root = tmp_path / "old"
    _hostile_run(root)
    generate_run(root, "synthetic", seed=1, calls=6)
    ingest(root, spool_mode="keep")
    column = f"SELECT run_id, source, seq, {search.COLUMN} FROM events ORDER BY ALL"
    with Store.open(root) as st:
        at_ingest = st.con.execute(column).fetchall()
        st.con.execute(f"ALTER TABLE events DROP COLUMN {search.COLUMN}")
        st.con.execute("DELETE FROM _amb_migrations WHERE name = 'core.m006_i18_payload_lower'")
    con = open_sql(root)  # read-only, as the viewer opens a store no writer has migrated yet
    assert not search.present(con) and "coalesce(" not in search.matches(con)
    before = {q: _viewer(con, RUN, q) for q in QUERIES}
    con.close()
    with Store.open(root) as st:  # a writer migrates it
        assert search.present(st.con)
        assert st.con.execute(column).fetchall() == at_ingest
        assert verify(st.con, st.blobs) == []
    con = open_sql(root)
    assert {q: _viewer(con, RUN, q) for q in QUERIES} == before
    con.close()


def test_verify_catches_the_copy_edited_alone(tmp_path):
    root = tmp_path / "store"
    _hostile_run(root)
    ingest(root)
    with Store.open(root) as st:
        st.con.execute(
            f"UPDATE events SET {search.COLUMN} = 'planted' "
            "WHERE run_id = ? AND source = 'recorder' AND seq = 3",
            [RUN],
        )
        found = verify(st.con, st.blobs)
    assert [(p.source, p.seq) for p in found] == [("recorder", 3)]
    assert f"column {search.COLUMN} differs from the payload" in found[0].what
