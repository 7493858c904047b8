"""A large request's JSON without its inline binary data, for the parse that feeds the record.

Multimodal requests carry images, audio and files inline as base64 strings (a data URL under
``url``/``image_url``/``file_data``, or raw base64 under ``data``). The parsers never read them, yet
decoding the JSON scans every byte while holding the GIL, on the core mitmproxy and the upstream
need at that moment. The request blob is always stored whole; only the parse gets the skimmed one.

Long strings are found with single-byte searches (memchr speed): at every ``STRIDE`` bytes the
quotes on either side are located, so a string of at least ``MIN_SPAN`` bytes is always straddled.
A string is cut only when it is the value of one of the ``CARRIERS`` keys (the quote not escaped)
and contains no backslash; its content becomes a marker. Anything the rules misjudge leaves invalid
JSON, and ``calls.parse_request`` then parses the whole body, as it does when a marker turns up in
a tool result's text.
"""

from __future__ import annotations

import secrets

MIN_SPAN = 64 * 1024
"""Strings shorter than this are left in place (skimming them would not pay for itself)."""

STRIDE = MIN_SPAN // 2
"""Distance between probes; at most ``MIN_SPAN`` so that no long string falls between two."""

CARRIERS = (b'"url"', b'"image_url"', b'"data"', b'"file_data"')
"""Keys whose long string values are binary payloads the parsers never read."""

MARKER_PREFIX = "amb-skimmed-"
"""How a cut string's marker begins (the rest is random per body)."""

_SPACE = b" \t\r\n"


def skim(body: bytes) -> tuple[bytes, str] | None:
    """``body`` with the contents of long binary strings replaced by a marker, and the marker.

    None when nothing was cut (the body is small or has no such string)."""
    n = len(body)
    if n < MIN_SPAN:
        return None
    marker = MARKER_PREFIX + secrets.token_hex(8)
    token = marker.encode()
    find, rfind = body.find, body.rfind
    parts: list[bytes] = []
    kept_from = 0  # body[kept_from:] is not yet in parts
    probe = STRIDE
    while probe < n:
        opening = rfind(b'"', kept_from, probe)
        closing = find(b'"', probe)
        if closing == -1:
            break
        if (
            opening != -1
            and closing - opening > MIN_SPAN
            and _carrier_value(body, opening)
            and _ends_value(body, closing)
            and find(b"\\", opening, closing) == -1
        ):
            parts.append(body[kept_from : opening + 1])
            parts.append(token)
            kept_from = closing
        probe = max(probe + STRIDE, closing + 1)
    if not parts:
        return None
    parts.append(body[kept_from:])
    return b"".join(parts), marker


def _carrier_value(body: bytes, quote: int) -> bool:
    """Whether the string opening at ``quote`` is the value of a ``CARRIERS`` key."""
    i = quote - 1
    while i >= 0 and body[i] in _SPACE:
        i -= 1
    if i < 0 or body[i] != ord(":"):
        return False
    i -= 1
    while i >= 0 and body[i] in _SPACE:
        i -= 1
    for key in CARRIERS:
        start = i + 1 - len(key)
        if start >= 0 and body[start : i + 1] == key and (start == 0 or body[start - 1] != ord("\\")):
            return True
    return False


def _ends_value(body: bytes, quote: int) -> bool:
    """Whether the string closing at ``quote`` is followed by the end of a value."""
    i = quote + 1
    while i < len(body) and body[i] in _SPACE:
        i += 1
    return i < len(body) and body[i] in b",}]"
