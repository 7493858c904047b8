"""Workspace file changes and observed reads, from the shim."""

from __future__ import annotations

from schemas.blob import BlobRef
from schemas.events.base import Payload


class FileWritten(Payload, frozen=True, tag="file.written"):
    """A file was created or modified."""

    path: str
    """Path relative to the workspace root (absolute when outside it)."""
    op: str = "modified"
    """``created`` or ``modified``."""
    size: int = 0
    sha256: str = ""
    """``sha256:<hex>`` of the content, always present."""
    content: BlobRef | None = None
    """The content, when it was under the size cap; None above it (hash only)."""
    pid: int | None = None


class FileDeleted(Payload, frozen=True, tag="file.deleted"):
    """A file was deleted."""

    path: str


class FileRenamed(Payload, frozen=True, tag="file.renamed"):
    """A file was renamed (``dst`` also gets a ``file.written`` if its content is new)."""

    src: str
    dst: str


class FileAccessed(Payload, frozen=True, tag="file.accessed"):
    """A watched path (e.g. one the task marks forbidden) was opened. A fact, not a verdict."""

    path: str
    mode: str = "r"
    pid: int | None = None
