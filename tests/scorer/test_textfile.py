"""Reading agent-written text: never hangs on a FIFO, never reads past the cap, says why."""

from __future__ import annotations

import os

import pytest

from scorer.grader.textfile import UnreadableText, read_text


def test_reads_utf8_text(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("FINDINGS: clear lungs ✓", encoding="utf-8")
    assert read_text(p, 100) == "FINDINGS: clear lungs ✓"


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.mkdir(), "not a regular file"),
        (lambda p: None, "not a regular file"),
        (lambda p: p.write_bytes(b"x" * 101), "larger than 100 bytes"),
        (lambda p: p.write_bytes(b"ok \xff\xfe"), "not UTF-8 (byte 3)"),
    ],
    ids=["fifo", "directory", "missing", "too-long", "not-utf8"],
)
def test_reasons(tmp_path, make, reason):
    p = tmp_path / "a.txt"
    make(p)
    with pytest.raises(UnreadableText, match=reason.replace("(", r"\(").replace(")", r"\)")):
        read_text(p, 100)


def test_custom_too_long_message(tmp_path):
    p = tmp_path / "r.txt"
    p.write_bytes(b"y" * 50)
    with pytest.raises(UnreadableText, match="report too long"):
        read_text(p, 10, "report too long")
