"""The project's error vocabulary.

Every error a user can cause (bad input, a tampered store, a malformed submission) is an
``AmbError``: the CLI prints its message as one line on stderr and exits with ``exit_code``,
never with a traceback. The exit codes: 1 the operation failed (a verify that finds tampering, a run
that failed, a store that cannot be read), 2 bad input (``BadInput``), 3 not found (``NotFound``).
Third-party errors are converted at the boundary (``raise X(...) from e``).
Anything that is not an ``AmbError`` is our bug and is allowed to surface loudly.
"""

from __future__ import annotations

import errno

from schemas.display import clip

NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""Errno values of a write refused for want of room: a full file system, a quota, a file over its
size limit. Any command can meet them; the CLI turns them into one line (``amb.main``)."""


class AmbError(Exception):
    """Base class: a clear, user-facing failure."""

    exit_code = 1


class SchemaError(AmbError):
    """An event or record does not match its schema."""


class UnknownEventKind(SchemaError):
    """An event kind this version of amb does not know (written by a newer amb?)."""


class NewerEventVersion(SchemaError):
    """An event whose kind version is newer than this amb understands."""


class SpoolError(AmbError):
    """A spool file cannot be written or read."""


class BlobError(AmbError):
    """A blob is missing, or its content does not match its address."""


class StoreError(AmbError):
    """The DuckDB store cannot be opened, migrated or queried."""


class IngestConflict(StoreError):
    """A spool disagrees with events already stored under the same key."""


class BadInput(AmbError):
    """The command's arguments, or a file they name, are not acceptable input (malformed, out of
    range, or a run id the store already holds). Exit code 2, as click's own usage errors."""

    exit_code = 2


class UsageError(BadInput):
    """The command's arguments are wrong."""


class NotFound(AmbError):
    """What the command names (a run, a store, a file) does not exist. Exit code 3."""

    exit_code = 3


class RunExists(BadInput):
    """A run id the store (or its spools) already holds: runs are never merged or reused in place."""


def quoted(value: object, limit: int = 240) -> str:
    """``value`` as a message shows it: ``repr`` (so control characters and bytes that are not UTF-8
    stay visible and harmless on a terminal), cut to ``limit`` characters (a 1 MB name stays one
    readable line)."""
    return clip(repr(value), limit)
