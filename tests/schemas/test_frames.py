"""The spool frame format: lengths, checksums, torn tails, corruption."""

from __future__ import annotations

import hashlib

import pytest

from schemas.errors import SpoolError
from schemas.frames import MAGIC, MAX_BODY, encode_frame, scan

BODIES = [b'{"a":1}', b'{"b":"' + b"x" * 300 + b'"}', b"{}"]


def frame(body: bytes) -> bytes:
    return encode_frame(body, hashlib.sha256(body).hexdigest())


def spool(*bodies: bytes) -> bytes:
    return MAGIC + b"".join(frame(b) for b in bodies)


def test_frame_layout():
    assert frame(b"{}") == b"2\t" + hashlib.sha256(b"{}").hexdigest().encode() + b"\t{}\n"


def test_scan_returns_every_frame():
    result = scan(spool(*BODIES))
    assert result.bodies == BODIES
    assert result.tail is None and result.end == len(spool(*BODIES))


@pytest.mark.parametrize("cut", [1, 2, 40, 69])  # the last frame is 1 + 1 + 64 + 1 + 2 + 1 = 70 bytes
def test_torn_tail_keeps_frames_before_it(cut):
    good = spool(*BODIES[:2])
    result = scan(spool(*BODIES)[: len(good) + cut])
    assert result.bodies == BODIES[:2]
    assert result.tail is not None and result.tail.offset == len(good) == result.end
    assert result.tail.why == "incomplete last frame"


def test_zero_filled_tail_is_a_torn_tail():
    result = scan(spool(*BODIES) + b"\0" * 100)
    assert result.tail is not None
    assert len(result.bodies) == 3 and result.tail.why == "zero-filled tail"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d.replace(b'{"a":1}', b'{"a":2}'), "checksum mismatch"),
        (lambda d: d.replace(b"7\t", b"8\t", 1), "length 8, body has 7"),
        (lambda d: d.replace(b"\t", b" ", 1), "not LENGTH TAB DIGEST TAB BODY"),
    ],
    ids=["checksum", "length", "layout"],
)
def test_corruption_before_the_end_is_an_error(damage, message):
    with pytest.raises(SpoolError, match=f"x.spool: corrupt frame 0 at byte {len(MAGIC)} .*{message}"):
        scan(damage(spool(*BODIES)), "x.spool")


def test_corrupt_complete_last_frame_is_an_error_not_a_tail():
    data = spool(*BODIES)
    with pytest.raises(SpoolError, match="corrupt frame 2"):
        scan(data[:-3] + b"{]\n")


def test_not_a_spool():
    with pytest.raises(SpoolError, match="bad magic"):
        scan(b"hello world, definitely not a spool")
    assert scan(MAGIC[:3]).tail is not None
    assert scan(b"").bodies == []


def test_bodies_with_raw_tab_newline_or_oversize_are_refused():
    for body in (b'{"a":"\t"}', b'{"a":"\n"}', b"x" * (MAX_BODY + 1)):
        with pytest.raises(SpoolError):
            frame(body)
