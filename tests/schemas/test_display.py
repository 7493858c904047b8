"""schemas.display: text shown to a person is clipped one way and never carries what a terminal
would obey (a newline, an escape sequence an agent wrote)."""

from __future__ import annotations

import os

from schemas.display import clip, for_message, one_line, table
from schemas.errors import quoted


def test_clip_keeps_short_text_and_marks_a_cut():
    assert clip("abc", 3) == "abc"
    assert clip("abcd", 3) == "ab…"
    assert clip("", 1) == ""


def test_one_line_escapes_what_a_terminal_would_obey():
    hostile = "ok\x1b]0;owned\x07\nnext\tcol\r\x00"
    shown = one_line(hostile)
    assert shown == "ok\\x1b]0;owned\\x07\\nnext\\tcol\\r\\x00"
    assert shown.isprintable()
    assert one_line("é × ✓") == "é × ✓"  # printable text stays as it is


def test_one_line_shows_bytes_that_are_not_utf8_as_their_value():
    name = os.fsdecode(b"bad\xffname")
    assert one_line(name) == "bad\\xffname"
    assert one_line("\ud800") == "\\ud800"  # a lone surrogate that is no byte


def test_a_message_says_how_long_a_cut_text_was():
    assert for_message("x" * 10, 4) == "xxxx… (10 characters)"
    assert for_message("a\nb") == "a\\nb"
    assert quoted({"k": "\x1b"}) == "{'k': '\\x1b'}" and quoted("x" * 300, 10) == "'xxxxxxxx…"


def test_a_table_aligns_one_line_cells():
    rows = [["a\x1b[2J", 1.23456, None], ["long text here", 2, "x\ny"]]
    assert table(["name", "n", "note"], rows, width=6).splitlines() == [
        "name    n      note",
        "------  -----  ----",
        "a\\x1b…  1.235",
        "long …  2      x\\ny",
    ]
    assert "long text here" in table(["name"], [["long text here"]], width=None)
