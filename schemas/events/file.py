"""Workspace file changes and observed reads, from the shim."""

from __future__ import annotations

from schemas.blob import BlobRef
from schemas.events.base import Payload


class FileWritten(Payload, frozen=True, tag="file.written"):
    """A file was created or modified."""

    VERSION = 2

    path: str
    """Path relative to the workspace root (absolute when outside it), as recorded text
    (``schemas.ostext``: the exact bytes of the name are ``os_bytes(path)``)."""
    op: str = "modified"
    """``created`` or ``modified``."""
    size: int = 0
    sha256: str = ""
    """``sha256:<hex>`` of the content, always present."""
    content: BlobRef | None = None
    """The content, when it was under the size cap; None above it (hash only)."""
    pid: int | None = None
    changed_ns: int | None = None
    """When the change happened as the kernel dated it: the file's ctime (which no process can set
    back, unlike its mtime), never later than the event's ``ts_ns`` (when it was observed). The
    observation can lag the change by the shim's scheduling; ``amb checkout`` places file changes
    in time by this. None when unknown (older recordings, imports)."""


class FileDeleted(Payload, frozen=True, tag="file.deleted"):
    """A file was deleted."""

    VERSION = 2

    path: str
    changed_ns: int | None = None
    """When it happened as the kernel dated it (its directory's ctime at observation), at most
    ``ts_ns``; None when unknown. See ``FileWritten.changed_ns``."""


class FileRenamed(Payload, frozen=True, tag="file.renamed"):
    """A file was renamed (``dst`` also gets a ``file.written`` if its content is new)."""

    VERSION = 2

    src: str
    dst: str
    changed_ns: int | None = None
    """When it happened as the kernel dated it (the renamed file's ctime at observation), at most
    ``ts_ns``; None when unknown. See ``FileWritten.changed_ns``."""


class FileAccessed(Payload, frozen=True, tag="file.accessed"):
    """A watched path (e.g. one the task marks forbidden) was opened. A fact, not a verdict."""

    VERSION = 2

    path: str
    mode: str = "r"
    pid: int | None = None
