"""Free-form notes (a harness marker, an operator comment)."""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.events.base import Payload


class Note(Payload, frozen=True, tag="note"):
    """A free-form note.

    Version history: v1 had one field ``message``; v2 renamed it ``text`` and added ``data``
    (upcaster ``note_v1_v2`` in ``schemas.upcast``).
    """

    VERSION = 2
    text: str
    data: dict[str, Any] = msgspec.field(default_factory=dict)
