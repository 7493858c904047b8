"""``amb --version``: the package version, the event versions it reads and writes, the store level,
so that a user can tell whether this amb reads a store or spool another amb wrote (older event
versions are upcast on read, newer ones refused)."""

from __future__ import annotations

import sys
from importlib import metadata

PACKAGE = "amb-recorder"


def package_version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown (not installed: run from a checkout without `pip install`)"


def event_versions() -> dict[str, tuple[int, int]]:
    """kind -> (oldest version it reads, the version it writes)."""
    from schemas.events import KINDS
    from schemas.upcast import UPCASTERS

    out = {}
    for kind, cls in sorted(KINDS.items()):
        oldest = cls.VERSION
        while (kind, oldest - 1) in UPCASTERS:
            oldest -= 1
        out[kind] = (oldest, cls.VERSION)
    return out


def store_migrations() -> list[str]:
    """The migrations this amb applies to a store, in order; the last of each set is its level."""
    from replay.migrations import CORE
    from scorer.migrations import MIGRATIONS

    return [m.name for m in CORE + MIGRATIONS]


def version_text() -> str:
    versions = event_versions()
    writes: dict[int, list[str]] = {}
    for kind, (_, v) in versions.items():
        writes.setdefault(v, []).append(kind)
    common = max(writes, key=lambda v: len(writes[v]))
    written = [f"v{common} ({len(writes[common])} kinds)"] + [
        f"{', '.join(kinds)} v{v}" for v, kinds in sorted(writes.items()) if v != common
    ]
    upcast = [f"{kind} v{lo}-v{hi}" for kind, (lo, hi) in versions.items() if lo < hi]
    levels = {name.split(".", 1)[0]: name for name in store_migrations()}  # the last of each set
    return "\n".join(
        [
            f"amb {package_version()} ({PACKAGE}, Python {sys.version.split()[0]})",
            f"events: writes {'; '.join(written)}; reads those"
            + (f" and, upcast on read, {', '.join(upcast)}" if upcast else ""),
            f"store: migration level {', '.join(levels.values())} ({len(store_migrations())} migrations)",
        ]
    )
