"""The viewer's workspace downloads: the same queries as ``amb files`` and ``amb checkout``
(``replay.workspace``), answered as JSON, a tar of the workspace at an event, or one file's
version at an event. Paths were checked by the fold (refused and outside ones are never in the
tar); every byte is checked against its recorded hash before it is sent. Paths are the recorded
text of names (``schemas.ostext``): JSON and the file query use it; the tar holds each file under
the exact bytes of its name."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import duckdb
import msgspec

from replay.web.resource import BadRequest, NotFound
from replay.workspace import Workspace, at_moment, content_of, run_events
from schemas.blobstore import BlobStore
from schemas.errors import UsageError
from schemas.ostext import os_str

TAR_CAP = 256 * 1024 * 1024
"""Largest workspace the viewer packs in memory; beyond it, `amb checkout` writes it to disk."""


def _at(con: duckdb.DuckDBPyConnection, run_id: str, at: str) -> Workspace:
    try:
        return at_moment(con, run_id, at, run_events(con, run_id))
    except UsageError as e:
        raise BadRequest(str(e)) from None


class WorkspaceFiles(msgspec.Struct):
    """``GET /api/runs/RUN/workspace?at=MOMENT``: what ``amb files RUN --at MOMENT --json`` prints."""

    moment: str
    files: list[dict[str, Any]]
    """Each file's path, size, sha256, whether its content is kept, the event that wrote it."""
    outside: list[dict[str, Any]]
    """Files outside the workspace (absolute paths)."""
    refused: list[dict[str, str]]
    """Events whose paths can never be inside a workspace, and why."""


def files_at(con: duckdb.DuckDBPyConnection, run_id: str, at: str) -> WorkspaceFiles:
    ws = _at(con, run_id, at)
    files = [f.row() for _, f in sorted(ws.files.items())]
    return WorkspaceFiles(ws.moment.label, files, [f.row() for f in ws.outside.values()], ws.refused)


def tar_at(con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, at: str) -> tuple[bytes, int]:
    """The workspace at ``at`` as a tar, and how many files in it were not kept (listed by
    ``files_at``)."""
    ws = _at(con, run_id, at)
    kept = [f for _, f in sorted(ws.files.items()) if f.blob is not None]
    if sum(f.size or 0 for f in kept) > TAR_CAP:
        raise BadRequest(
            f"the workspace is over {TAR_CAP >> 20} MiB: use `amb checkout {run_id} DIR --at {at}`"
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in kept:
            data = content_of(f, blobs)
            info = tarfile.TarInfo(os_str(f.path))  # (PAX keeps a name that is not UTF-8 as its bytes)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), len(ws.files) - len(kept)


def file_at(
    con: duckdb.DuckDBPyConnection, blobs: BlobStore, run_id: str, at: str, path: str
) -> tuple[bytes, str]:
    """One file's content at ``at`` (and the event that wrote it)."""
    ws = _at(con, run_id, at)
    f = ws.files.get(path) or ws.outside.get(path)
    if f is None:
        raise NotFound(f"no file {path!r} in the workspace at {ws.moment.label}")
    if f.blob is None:
        raise NotFound(f"{path}: content not kept ({f.note}); sha256 {f.sha256}")
    return content_of(f, blobs), f.event
