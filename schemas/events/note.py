"""Free-form notes (a harness marker, an operator comment)."""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.events.base import Payload


class Note(Payload, frozen=True, tag="note"):
    """A free-form note (v1's ``message`` is v2's ``text``: ``schemas.upcast.note_v1_v2``)."""

    VERSION = 2
    text: str
    data: dict[str, Any] = msgspec.field(default_factory=dict)
