"""OS strings (file names, paths, argv, cwd, environment) as events record them: text that keeps every byte.

Linux gives these as bytes, with no promise that they are UTF-8; events are canonical JSON, which
holds UTF-8 text only. The recorded form (``os_text``) is the name's UTF-8 text, with two escapes:

- a byte that is not part of valid UTF-8 is written ``\\xhh`` (a backslash, ``x``, two lowercase hex
  digits: the name ``b"x\\xff"`` is recorded as the 5 characters ``x\\xff``);
- a backslash of the name itself is doubled (``a\\b`` is recorded as ``a\\\\b``), so that a real name that
  looks like an escape stays apart from the byte it would stand for.

Everything else (any valid UTF-8, control characters included: JSON escapes those itself) is
recorded as it is, so the recorded text of a UTF-8 name without a backslash is the name.

Every bytes string has exactly one recorded text, and every recorded text one bytes string:
``os_bytes`` reverses ``os_text`` and refuses a text that ``os_text`` cannot have produced
(``\\x41``, ``\\xc3\\xa9``, an uppercase ``\\xFF``, a lone backslash), so the same name always has
the same canonical event bytes and so the same hash. In memory, Python's own form of an OS string
(``os.fsdecode``: undecodable bytes as lone surrogates, ``surrogateescape``) is what ``os_str`` gives
back, for ``os`` functions and for comparisons that must see the real name.
"""

from __future__ import annotations

import os
import re

from schemas.errors import SchemaError, quoted

_ESCAPE = re.compile(r"\\(\\|x[0-9a-fA-F]{2})?")


class NotOsText(SchemaError):
    """A text that is not the recorded form of any OS string (see ``os_text``)."""


def os_text(raw: bytes | str) -> str:
    """The recorded text of an OS string: given as bytes, or as Python's ``os.fsdecode`` form (a
    text, such as an imported one, is the OS string of its UTF-8 bytes)."""
    try:
        data = raw if isinstance(raw, bytes) else os.fsencode(raw)
    except UnicodeEncodeError:
        raise NotOsText(f"{quoted(str(raw))} is not an OS string: it holds a lone surrogate") from None
    # A backslash byte (0x5c) is never part of a multi-byte UTF-8 sequence: doubling it in the bytes
    # doubles exactly the name's own backslashes; Python's "backslashreplace" then writes every byte
    # that is not valid UTF-8 as \xhh.
    return data.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def os_bytes(text: str) -> bytes:
    """The exact bytes of the OS string whose recorded text is ``text`` (``NotOsText`` if none)."""
    try:
        plain = text.encode("utf-8")
    except UnicodeEncodeError:
        raise NotOsText(f"{quoted(text)} is not a recorded OS string: it holds a lone surrogate") from None
    if b"\\" not in plain:
        return plain
    out = bytearray()
    at = 0
    for m in _ESCAPE.finditer(text):
        esc = m.group(1)
        if esc is None:
            raise NotOsText(f"{quoted(text)} is not a recorded OS string: a backslash that escapes nothing")
        out += text[at : m.start()].encode("utf-8")
        out += b"\\" if esc == "\\" else bytes([int(esc[1:], 16)])
        at = m.end()
    out += text[at:].encode("utf-8")
    data = bytes(out)
    if os_text(data) != text:  # \x41 for "A", \xc3\xa9 for "é", \xFF: the same name spelled otherwise
        raise NotOsText(f"{quoted(text)} is not a recorded OS string: an escape of bytes that need none")
    return data


def quoting(text: str) -> str:
    """Free text (an error message) that may quote OS strings in Python's form, made recordable: each
    byte that is not UTF-8 written ``\\xhh`` as ``os_text`` writes it. Backslashes stay as they are:
    this is a message about names, not a recorded name (``os_bytes`` does not apply to it)."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no OS string gives
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def os_str(text: str) -> str:
    """The OS string whose recorded text is ``text``, as Python's ``os`` functions take it."""
    return os.fsdecode(os_bytes(text))


def is_utf8(text: str) -> bool:
    """Whether UTF-8 can hold ``text``: False for a lone surrogate (in Python's form of an OS string,
    a byte that is not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
