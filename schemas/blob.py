"""References to content-addressed blobs.

Large content (request and response bodies, stdout, file contents) never sits inside an event:
the event carries a ``BlobRef`` and the bytes live once in the blob store, keyed by the sha256 of
the *uncompressed* content. The field is named ``blob`` (not ``sha256``) on purpose: a payload may
also carry the plain sha256 of something that was *not* stored (a file above the size cap), and
``amb verify`` finds every stored reference by the pattern ``"blob":"sha256:<hex>"``.
"""

from __future__ import annotations

import hashlib
import re

import msgspec

HASH_PREFIX = "sha256:"
"""Every digest carries its algorithm, so a future change of algorithm is detectable."""

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}\Z")


def digest(data: bytes) -> str:
    """The address of ``data``: ``sha256:`` followed by 64 lowercase hex digits."""
    return HASH_PREFIX + hashlib.sha256(data).hexdigest()


class BlobRef(msgspec.Struct, frozen=True, kw_only=True):
    """A pointer to stored bytes."""

    blob: str
    """``sha256:<hex>`` of the uncompressed content; the blob's address."""
    size: int
    """Uncompressed size in bytes."""
    media_type: str = "application/octet-stream"
    """What the bytes are (``application/json``, ``text/event-stream``, ``text/plain``, ...)."""
