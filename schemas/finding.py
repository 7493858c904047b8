"""A scanner's finding: the shape ``amb scan`` stores in ``scan_results.findings`` and the viewer
reads back (the scorer writes it, the read side only shows it, so it lives below both)."""

from __future__ import annotations

import msgspec

Value = bool | int | float | str | None


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """What a scanner found in one run: ``value`` (True = flagged), why, and the events showing it."""

    value: Value = True
    explanation: str = ""
    events: list[str] = []
    """``SOURCE:SEQ`` of each event that shows it."""
