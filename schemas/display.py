"""Text for a person to read (DISPLAY: a terminal, an error line, a viewer page), clipped and with
nothing a terminal would obey; it loses characters and is never stored or hashed. How OS bytes are
RECORDED, byte for byte, is ``schemas.ostext``; a value quoted in a message is
``schemas.errors.quoted``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, BinaryIO, TextIO

ELLIPSIS = "…"


def clip(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit - 1`` and ``…``."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def one_line(text: str) -> str:
    """``text`` as one printable line: each byte that is not UTF-8 (Python's ``surrogateescape``
    form of an OS string) as ``\\xNN``, other surrogates and control characters (a newline, a tab, a
    terminal's ESC) as Python escapes; every other character as it is."""
    if text.isprintable():
        return text
    return "".join(
        c
        if c.isprintable()
        else (f"\\x{ord(c) - 0xDC00:02x}" if "\udc80" <= c <= "\udcff" else repr(c)[1:-1])
        for c in text
    )


def relay(stream: BinaryIO, out: TextIO) -> None:
    """What another process printed (``stream``, read to its end), line by line to ``out``, each
    line ``one_line``: what it prints may quote the agent's text, which is no terminal's
    instruction."""
    for raw in iter(lambda: stream.readline(1 << 16), b""):
        out.write(one_line(raw.decode("utf-8", "replace").removesuffix("\n")) + "\n")
        out.flush()


def for_message(text: str, limit: int = 200) -> str:
    """``text`` for an error or warning line: ``one_line`` of its first ``limit`` characters, and
    how long it was when it was longer."""
    shown = one_line(text[:limit])
    return shown if len(text) <= limit else f"{shown}{ELLIPSIS} ({len(text)} characters)"


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], width: int | None = 60) -> str:
    """Rows as aligned columns under a header and a rule. A cell is its value on one line
    (``one_line``: agents' text reaches no terminal as an escape), clipped to ``width``; a float
    with 4 significant digits; nothing for None."""

    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.4g}"
        text = one_line(str(value))
        return text if width is None else clip(text, width)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])
