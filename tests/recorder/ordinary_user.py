"""An ordinary user for tests that run as root: ``nobody``, with amb's own interpreter within reach.

What a same-user agent can reach is only a question for an ordinary user (root reads every
process's memory), so such tests run amb-record as ``nobody``. ``setpriv`` alone is not enough
where the interpreter lives under a directory that ``nobody`` may not enter (a Python built under
``/root``): amb-record's own start succeeds on ``setpriv``'s capabilities, but no process it starts
could run that interpreter again, as an ordinary user can run their own. ``as_nobody`` wraps a
command so that it runs as ``nobody`` in a mount namespace of its own in which a tmpfs covers that
directory and the interpreter's prefix is bound back in its place: the same interpreter and
packages, nothing else of the covered directory.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NOBODY = 65534

COVER = (
    'set -e; mount --bind "$1" "$3"; mount -t tmpfs -o mode=0755 amb-test-cover "$2"; '
    'mkdir -p "$1"; mount --bind "$3" "$1"; shift 3; exec "$@"'
)
"""Run by root in the private mount namespace: $1 the interpreter's prefix, $2 the closed directory
above it, $3 an empty directory to hold the prefix while $2 is covered; then the command."""


def closed_ancestor(path: Path) -> Path | None:
    """The highest directory on the way to ``path`` that others may not search, if any."""
    for parent in reversed(path.parents):
        if not parent.stat().st_mode & stat.S_IXOTH:
            return parent
    return None


CHECKOUT = Path(__file__).resolve().parents[2]


def require_reachable_checkout() -> None:
    """Fail in one line when ``nobody`` cannot enter this checkout (its .venv, its agents): a clone
    under a 0700 directory (``mktemp -d``) otherwise fails later as Permission denied or bad JSON."""
    closed = closed_ancestor(CHECKOUT / "x")
    if closed is not None:
        raise AssertionError(
            f"the checkout {CHECKOUT} is not readable by an ordinary user: {closed} is closed to others "
            f"(mode {closed.stat().st_mode & 0o777:o}); clone it under a directory others may enter"
        )


def as_nobody(argv: list[str], stage: Path) -> list[str]:
    """``argv`` run as ``nobody`` (no capabilities, no groups), with amb's interpreter reachable;
    ``stage``: an empty directory this may mount on (in its own mount namespace only)."""
    require_reachable_checkout()
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all"]
    prefix = Path(sys.base_prefix).resolve()
    closed = closed_ancestor(prefix)
    if closed is None:
        return [*drop, *argv]
    cover = ["unshare", "--mount", "--propagation", "private", "sh", "-c", COVER, "sh"]
    return [*cover, str(prefix), str(closed), str(stage), *drop, *argv]


@contextmanager
def nobody_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory in the temp dir that ``nobody`` owns (``nobody`` cannot enter pytest's)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chown(d, NOBODY, NOBODY)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
