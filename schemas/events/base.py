"""The base of every event payload.

A payload is a frozen msgspec Struct with an explicit dotted tag (``kind``) and a kind version
(``VERSION``). Tags never derive from class names, so renaming a class never rewrites history.
Stored payloads never use ``omit_defaults`` (an observed value must stay on disk even if a default
later changes) nor ``forbid_unknown_fields`` (an older reader must skip fields it does not know).

Evolution is additive: a new field gets a default and goes at the end. Anything else bumps the
kind's ``VERSION`` and adds an upcaster in ``schemas.upcast``. The kinds that hold OS strings (file
names, argv, cwd: ``schemas.upcast.OS_FIELDS``) hold them as recorded text (``schemas.ostext``) since
their v2; their v1 held plain text.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec


class Payload(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of all event payloads; the tag lives in the ``kind`` field."""

    VERSION: ClassVar[int] = 1


def kind_of(payload_type: type[Payload]) -> str:
    """The dotted tag of a payload class."""
    # Why the ignore[return-value] below: every payload class has a str tag (msgspec types it wider).
    return payload_type.__struct_config__.tag  # type: ignore[return-value]
