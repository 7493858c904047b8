"""OS strings as events record them (``schemas.ostext``): every byte kept, one text per name.

Linux names, argv and environment are bytes with no promise of UTF-8; the recorded text writes a
byte that is not UTF-8 as ``\\xhh`` and doubles a name's own backslash. These tests hold it to that
over arbitrary bytes: it round-trips, two names never share a text, a text belongs to one name
only (so an event's canonical bytes, and its hash, are a function of the names it holds), and old
(v1) events, which held names as plain text, read as the names they recorded.
"""

from __future__ import annotations

import os

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.codec import decode_payload, encode_payload, hash_body
from schemas.errors import SchemaError
from schemas.events import FileRenamed, FileWritten, ProcessExited, SealedFile, SubmissionSealed
from schemas.ostext import NotOsText, os_bytes, os_str, os_text, quoting
from schemas.upcast import upcast

# Names an agent can make: any bytes, and bytes built to look like escapes or UTF-8 edge cases.
_PIECES = st.sampled_from(
    [
        b"\\",
        b"\\\\",
        b"\\x",
        b"\\xff",
        b"\\x41",
        b"x",
        b"\xff",
        b"\xc3",
        b"\xa9",
        b"\xc3\xa9",
        b"\xed\xa0\x80",
    ]
)
NAMES = st.one_of(st.binary(max_size=64), st.lists(_PIECES, max_size=12).map(b"".join))


@given(NAMES)
def test_round_trip_through_text_and_through_python_form(raw: bytes) -> None:
    text = os_text(raw)
    assert os_bytes(text) == raw
    assert os_text(os.fsdecode(raw)) == text  # the shim's in-memory form gives the same text
    assert os.fsencode(os_str(text)) == raw
    text.encode("utf-8")  # always UTF-8: what the canonical JSON can hold (no lone surrogate)


@given(NAMES, NAMES)
def test_two_names_never_share_a_text(a: bytes, b: bytes) -> None:
    assert (os_text(a) == os_text(b)) == (a == b)


@given(st.text(max_size=40))
def test_a_text_is_the_recording_of_one_name_or_of_none(text: str) -> None:
    # Canonical: a text that decodes is exactly the recording of what it decodes to, so no name
    # has a second spelling (\x41 for A, \xc3\xa9 for é, \xFF for \xff are refused).
    try:
        raw = os_bytes(text)
    except NotOsText:
        return
    assert os_text(raw) == text


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"plain.txt", "plain.txt"),
        ("café ✓".encode(), "café ✓"),
        (b"x\xff", "x\\xff"),
        (b"a\\b", "a\\\\b"),
        (b"\\xff", "\\\\xff"),  # a real name that looks like an escape
        (b"\\\xff", "\\\\\\xff"),
        (b"\xed\xa0\x80", "\\xed\\xa0\\x80"),  # an encoded surrogate is not UTF-8
        (b"tab\there", "tab\there"),
    ],
)
def test_the_documented_form(raw: bytes, text: str) -> None:
    assert os_text(raw) == text and os_bytes(text) == raw


@pytest.mark.parametrize("text", ["\\x41", "\\xc3\\xa9", "\\xFF", "a\\", "\\q", "\\x4", "x\udcff"])
def test_other_spellings_are_refused(text: str) -> None:
    with pytest.raises(NotOsText):
        os_bytes(text)


def _payload(argv: list[bytes]) -> bytes:
    return encode_payload(ProcessExited(pid=1, argv=[os_text(a) for a in argv], cwd=os_text(argv[0])))


@given(st.lists(NAMES, min_size=1, max_size=4), st.lists(NAMES, min_size=1, max_size=4))
def test_an_events_canonical_bytes_and_hash_are_those_of_its_names(a: list[bytes], b: list[bytes]) -> None:
    body = _payload(a)
    # The same names reached another way (the shim's in-memory form) give the same bytes and hash.
    again = _payload([os.fsencode(os.fsdecode(n)) for n in a])
    assert again == body and hash_body(again) == hash_body(body)
    assert (_payload(b) == body) == (a == b)
    decoded = decode_payload("process.exited", 2, body)
    assert isinstance(decoded, ProcessExited) and [os_bytes(x) for x in decoded.argv] == a
    assert encode_payload(decoded) == body


def test_a_lone_surrogate_is_refused_by_the_codec_with_a_clear_error() -> None:
    with pytest.raises(SchemaError, match="file.written payload holds text that is not UTF-8"):
        encode_payload(FileWritten(path=os.fsdecode(b"x\xff"), sha256="sha256:0"))


def test_quoting_writes_undecodable_bytes_as_the_names_do() -> None:
    message = "cannot open " + os.fsdecode(b"x\xff") + ": no such file"
    assert quoting(message) == "cannot open x\\xff: no such file"
    assert quoting("lone \ud800 surrogate") == "lone \\ud800 surrogate"


@pytest.mark.parametrize(
    ("kind", "old", "new"),
    [
        ("file.written", {"path": "a\\b", "size": 1}, {"path": "a\\\\b", "size": 1}),
        ("file.renamed", {"src": "\\xff", "dst": "c"}, {"src": "\\\\xff", "dst": "c"}),
        (
            "process.exited",
            {"argv": ["printf", "a\\n"], "cwd": "/w\\s"},
            {"argv": ["printf", "a\\\\n"], "cwd": "/w\\\\s"},
        ),
        ("run.started", {"command": ["x\\"], "workspace": None}, {"command": ["x\\\\"], "workspace": None}),
        (
            "submission.sealed",
            {"root": "/w", "files": [{"path": "a\\b", "size": 1}], "skipped": ["l\\n: symlink"]},
            {"root": "/w", "files": [{"path": "a\\\\b", "size": 1}], "skipped": ["l\\\\n: symlink"]},
        ),
    ],
)
def test_v1_names_upcast_to_their_recorded_text(kind: str, old: dict, new: dict) -> None:
    assert upcast(kind, 1, 2, old) == new


def test_a_v1_payload_reads_as_the_names_it_held() -> None:
    old = msgspec.json.encode(
        {
            "kind": "submission.sealed",
            "root": "/w",
            "files": [{"path": "\\xff.txt", "size": 0, "sha256": "s"}],
        }
    )
    sealed = decode_payload("submission.sealed", 1, old)
    assert isinstance(sealed, SubmissionSealed)
    assert sealed.files == [SealedFile(path="\\\\xff.txt", size=0, sha256="s")]
    assert os_bytes(sealed.files[0].path) == b"\\xff.txt"  # the 8 characters v1 recorded
    assert FileRenamed.VERSION == 2
