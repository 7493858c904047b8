"""The sealed submission: the workspace's deliverables at the end of the run."""

from __future__ import annotations

import msgspec

from schemas.blob import BlobRef
from schemas.events.base import Payload


class SealedFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    """Relative to ``root``, as recorded text (``schemas.ostext``)."""
    size: int
    sha256: str
    content: BlobRef | None = None


class SubmissionSealed(Payload, frozen=True, tag="submission.sealed"):
    """Every file of the submission, content-addressed, as it was when the run ended."""

    VERSION = 2

    root: str = ""
    """The workspace directory that was sealed."""
    files: list[SealedFile] = msgspec.field(default_factory=list)
    skipped: list[str] = msgspec.field(default_factory=list)
    """Files left out (over the size cap, unreadable), each as its recorded text with its reason
    after a colon."""
