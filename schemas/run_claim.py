"""Run ids are never reused in place: a store holds a run id once any spool of it holds an event.

A store's spool folder ``spool/<run id>/`` is the run's claim. Ingest keeps every spool there after
loading it (as written, compressed, or as an empty ``.dropped`` marker: ``replay.spools``), so
whether an id is taken is answered from the file system alone, without opening the database, by
everything that writes runs (amb-record, the importers, ``amb generate``, ``amb ingest --from``)
before it writes a byte. A run is never merged with another of the same id: a second writer's
events under a taken id would join the first run's and break its anchored manifest.

A plain spool holding no event (only its magic: a writer that died before its first event) is no
claim, nor is anything else in the folder (an importer's ``.partial`` spool, a blob pack).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from schemas.codec import check_id
from schemas.errors import RunExists
from schemas.frames import COMPRESSED_SUFFIX, DROPPED_SUFFIX, MAGIC


@contextmanager
def claiming(store: str | os.PathLike[str]) -> Iterator[None]:
    """Held while a writer checks that a run id is free and makes it taken (``amb generate``, an
    import's publish), so two writers into one store never both find an id free: an exclusive
    ``flock`` on the store's directory itself (no file is added to the store; a writer into
    another store is not held up)."""
    os.makedirs(store, exist_ok=True)
    fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


SPOOL_SUFFIX = ".spool"
_FORMS = (SPOOL_SUFFIX, SPOOL_SUFFIX + COMPRESSED_SUFFIX, SPOOL_SUFFIX + DROPPED_SUFFIX)
"""A spool as written, compressed after ingest, dropped after ingest: the plain one first, since
ingest reads it when a crash between compressing and removing left both."""


def held_spools(store: str | os.PathLike[str], run_id: str) -> dict[str, Path]:
    """The spools the store holds for ``run_id``, by source, each in the form it is in (a path
    ending in ``.spool``, ``.spool.zst`` or ``.spool.dropped``). Empty: the id is free."""
    run_dir = Path(store) / "spool" / check_id("run id", run_id)
    try:
        names = set(os.listdir(run_dir))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    held: dict[str, Path] = {}
    for suffix in _FORMS:
        for name in sorted(n for n in names if n.endswith(suffix)):
            source = name[: -len(suffix)]
            path = run_dir / name
            if source in held or (suffix == SPOOL_SUFFIX and _no_event(path)):
                continue
            held[source] = path
    return held


def _no_event(path: Path) -> bool:
    try:
        return path.stat().st_size <= len(MAGIC)
    except OSError:
        return True


def require_free(store: str | os.PathLike[str], run_id: str, way_out: str) -> None:
    """``RunExists`` naming the run, what the store holds of it and ``way_out`` (the next step) when
    the store already holds ``run_id``."""
    held = held_spools(store, run_id)
    if held:
        raise RunExists(taken_message(store, run_id, held, way_out))


def taken_message(
    store: str | os.PathLike[str], run_id: str, held: dict[str, Path], way_out: str, why: str = ""
) -> str:
    """The one line that refuses ``run_id``: what the store holds of it, ``why`` the run coming in
    is not that run (when known), and ``way_out``."""
    return (
        f"run id {run_id!r} already exists in {store} (its {', '.join(sorted(held))} spools"
        f"{'; ' + why if why else ''}); runs are never merged or reused in place: {way_out}"
    )
