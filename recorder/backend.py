"""The backend seam: where and how the agent process runs (``--backend local|docker``).

``recorder.run`` owns everything that is the same for every backend: the recording proxy, the
per-run CA, credential custody, the time limit, signals, ``run.started``/``run.finished``. A
backend owns only the agent's process (or container) and its workspace. The orchestrator calls,
in this order::

    host = backend.proxy_listen_host()          # where the proxy must bind to be reachable
    ... the proxy starts; its CA exists ...
    view = backend.prepare(ctx)                 # how the agent will see the proxy, CA, workspace
    env  = ...amb's variables, built from view...  (base URLs, HTTP(S)_PROXY, CA paths, placeholders)
    handle = backend.start(argv, env)
    backend.wait(handle, timeout)  ->  Exit | None   (polled; None = still running)
    backend.send_signal(handle, SIGINT|SIGTERM)  /  backend.kill(handle)   (time limit, forwarding)
    sealed = backend.seal_submission(handle)    # after the agent has ended; a SubmissionSealed
    backend.close(handle)                       # always called, even after errors

Everything about the run arrives in ``prepare(ctx)``. ``env`` holds only amb's variables (base
URLs, proxies, CA paths, placeholder keys, ``AMB_RUN_ID``), with paths as the agent sees them: the
local backend layers it over its own environment with the real keys removed, a container backend
passes it (and nothing of the host's) into the container. A backend never sees the real API keys.
Extra event sources (the shim's ``shim`` spool) are the backend's business.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from schemas.blobstore import BlobStore
from schemas.events import Isolation, SealedFile, SubmissionSealed
from schemas.ostext import os_text

SEAL_FILE_CAP = 16 * 1024 * 1024
"""Files larger than this are sealed by hash only (their content is not copied into blobs)."""

SEAL_TOTAL_CAP = 1024 * 1024 * 1024
"""Stop storing content once this many bytes of the submission were stored (hash the rest)."""

SEAL_MAX_FILES = 5_000
"""A workspace with more files than this is sealed up to the limit; the rest, taken from the most
crowded directories, are counted as skipped (an event must stay under the spool's frame limit, so
the listing itself is bounded too)."""

SEAL_MAX_DEPTH = 256
"""Folders nested deeper than this below the workspace are left out, each named in ``skipped``."""

SEAL_MAX_SKIPPED = 100
"""Skipped files listed by name; beyond this, one summary entry says how many more there were."""


@dataclass(frozen=True)
class RunContext:
    """What a backend knows about the run it hosts."""

    run_id: str
    store: Path
    blobs: BlobStore
    workspace: Path
    """On the host: the agent's working directory and what gets sealed."""
    data_dir: Path | None = None
    """Task inputs (``--data``), to be offered read-only."""
    task: str | None = None
    tier: str | None = None
    time_limit_s: float | None = None
    ca_cert: Path | None = None
    ca_bundle: Path | None = None
    """System CAs + the per-run CA (PEM): what SSL_CERT_FILE & co. point at."""
    proxy_ports: dict[str, int] = field(default_factory=dict)
    """``openai`` / ``anthropic`` (reverse endpoints) and ``regular`` (HTTP(S) proxy) ports."""


@dataclass(frozen=True)
class AgentView:
    """How the agent sees the recorder's pieces (host paths for local, container paths for docker)."""

    proxy_host: str
    ca_bundle: str
    workspace: str
    isolation: Isolation | None = None
    """What keeps the agent from the machine's other processes (recorded in ``run.started``)."""
    data: str | None = None
    """The task's inputs (``--data``), given to the agent as ``AMB_DATA``."""


@dataclass(frozen=True)
class Exit:
    code: int
    """The shell's convention: the exit status, or 128+N when killed by signal N."""
    signal: int | None = None
    failure: str | None = None
    """Set when the agent's environment ended it (its container ran out of memory): the run is then
    ``failed`` with this as its reason, whatever the exit code."""
    lost: str | None = None
    """Set when the backend's own record of the agent ended before the agent did (the shim died):
    the run is then a ``recorder_error``, with this as its reason."""


@runtime_checkable
class Backend(Protocol):
    name: str
    """``local`` or ``docker``: recorded in ``run.started.backend``."""

    def proxy_listen_host(self) -> str:
        """The address the proxy binds so that the agent can reach it (``127.0.0.1`` locally)."""

    def prepare(self, ctx: RunContext) -> AgentView:
        """Set up the workspace (and image, network, mounts); no agent process yet."""

    def start(self, argv: list[str], env: dict[str, str]) -> Any:
        """Start the agent; return an opaque handle. Raise ``AmbError`` if it cannot start."""

    def wait(self, handle: Any, timeout: float | None) -> Exit | None:
        """The agent's exit, or None if it still runs after ``timeout`` seconds (polled: never longer)."""

    def send_signal(self, handle: Any, sig: int) -> None:
        """Deliver ``sig`` to the agent (its process group, so its children get it too)."""

    def kill(self, handle: Any) -> None:
        """SIGKILL the agent and everything it started."""

    def pid(self, handle: Any) -> int | None:
        """The agent's pid as the host sees it (for ``process.exited``), if there is one."""

    def seal_submission(self, handle: Any) -> SubmissionSealed:
        """The workspace's files as they are now (the agent has ended)."""

    def close(self, handle: Any) -> None:
        """Release everything (containers, networks, temp files), even after errors. Idempotent."""

    def tool_versions(self) -> dict[str, str]:
        """Versions worth recording in ``run.started`` (image digest, docker version, ...)."""


def seal_directory(
    root: Path, blobs: BlobStore, *, shown_root: str | None = None, exclude: tuple[Path, ...] = ()
) -> SubmissionSealed:
    """Hash every regular file under ``root``; store content under the caps.

    Symlinks are skipped (following one could seal a file outside the workspace), and so are the
    directories in ``exclude`` (the store, the per-run CA key, when they lie inside the workspace)."""
    files: list[SealedFile] = []
    skipped: list[str] = []
    stored = 0
    regular = _workspace_files(root, exclude, skipped)
    left_out = _beyond_limit([rel for rel, _ in regular], SEAL_MAX_FILES)
    for rel, full in regular:
        if rel in left_out:
            skipped.append(f"{rel}: over the {SEAL_MAX_FILES}-file limit")
            continue
        path = Path(full)
        try:
            size = path.stat().st_size
            if size <= SEAL_FILE_CAP and stored + size <= SEAL_TOTAL_CAP:
                data = path.read_bytes()
                ref = blobs.put(data, media_type(path.name), sync=False)
                stored += len(data)
                files.append(SealedFile(path=rel, size=len(data), sha256=ref.blob, content=ref))
            else:
                with open(path, "rb") as f:
                    sha = "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
                files.append(SealedFile(path=rel, size=size, sha256=sha))
        except OSError as e:
            skipped.append(f"{rel}: unreadable ({e.strerror or 'error ' + str(e.errno)})")
    blobs.flush()  # one fsync for every file stored, before the event that names them is written
    if len(skipped) > SEAL_MAX_SKIPPED:
        skipped = skipped[:SEAL_MAX_SKIPPED] + [f"...: {len(skipped) - SEAL_MAX_SKIPPED} more files skipped"]
    return SubmissionSealed(root=os_text(shown_root or str(root)), files=files, skipped=skipped)


def _workspace_files(root: Path, exclude: tuple[Path, ...], skipped: list[str]) -> list[tuple[str, str]]:
    """(recorded relative path, path) of every regular file under ``root``, in sorted depth-first
    order; what is left out is named in ``skipped``. An agent decides how many files there are and
    how deep they nest: the walk keeps its own stack (a recursive one fails a thousand folders deep),
    stops at ``SEAL_MAX_DEPTH``, and costs one lstat per file and string joins."""
    real_top = str(root.resolve())
    excluded = {str(Path(p).resolve()) for p in exclude}
    regular: list[tuple[str, str]] = []
    stack = [(str(root), "", 0)]  # (folder, its path below root, its depth)
    while stack:
        folder, below, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        except OSError as e:
            skipped.append(f"{os_text(below) or '.'}/: unreadable ({e.strerror or 'error ' + str(e.errno)})")
            continue
        subfolders = []
        for name, is_dir in entries:
            full, rel = f"{folder}/{name}", f"{below}/{name}" if below else name
            if is_dir:
                if excluded and os.path.join(real_top, rel) in excluded:
                    skipped.append(f"{os_text(rel)}/: amb-record's own files")
                elif depth + 1 > SEAL_MAX_DEPTH:
                    skipped.append(f"{os_text(rel)}/: more than {SEAL_MAX_DEPTH} folders deep")
                else:
                    subfolders.append((full, rel, depth + 1))
                continue
            rel = os_text(rel)
            try:
                mode = os.lstat(full).st_mode
            except OSError as e:
                skipped.append(f"{rel}: unreadable ({e.strerror or 'error ' + str(e.errno)})")
                continue
            if stat.S_ISLNK(mode):
                skipped.append(f"{rel}: symlink")
            elif not stat.S_ISREG(mode):
                skipped.append(f"{rel}: not a regular file")
            else:
                regular.append((rel, full))
        stack += reversed(subfolders)
    return regular


def _beyond_limit(rels: list[str], max_files: int) -> set[str]:
    """The files a seal of more than ``max_files`` leaves out: those of the most crowded directories,
    so that files dumped in one directory cannot push the deliverables out of the submission."""
    if len(rels) <= max_files:
        return set()
    dirs = [rel.rpartition("/")[0] for rel in rels]
    per_dir = Counter(dirs)
    ranked = [rel for _, rel in sorted(zip((per_dir[d] for d in dirs), rels, strict=True))]
    return set(ranked[max_files:])


def media_type(name: str) -> str:
    """The media type a stored file's content is recorded with, from its name."""
    lower = name.lower()
    for suffix, media in (
        (".json", "application/json"),
        (".md", "text/markdown"),
        (".txt", "text/plain"),
        (".csv", "text/csv"),
        (".py", "text/x-python"),
        (".sh", "text/x-shellscript"),
        (".png", "image/png"),
        (".gz", "application/gzip"),
    ):
        if lower.endswith(suffix):
            return media
    return "application/octet-stream"
