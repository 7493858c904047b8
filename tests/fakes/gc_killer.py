"""``amb gc --blobs`` that kills itself with SIGKILL at a chosen point of its repack.

Run as ``python -m tests.fakes.gc_killer POINT STORE``. The command is the real one (``amb.main``,
in this process); only the point where it dies is chosen, by wrapping the step it is about to take:

- ``mid-repack``: after ``AFTER`` records were appended to the new pack (not yet closed, so its
  tail and index are as a crash leaves them);
- ``new-pack-sealed``: right after the new pack and its index were closed (fsync'd), before any
  old pack was removed (every kept blob is in two packs);
- ``old-index-removed``: after the first old pack's index was removed, before the pack itself
  (a pack without an index).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from schemas import packstore

AFTER = 5


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str) -> None:
    patch = pytest.MonkeyPatch()  # for the life of this process
    if point == "mid-repack":
        append = packstore.PackWriter.append
        count = [0]

        def append_then_die(self: packstore.PackWriter, *args: Any, **kwargs: Any) -> packstore.Entry:
            count[0] += 1
            if count[0] > AFTER:
                _die()
            return append(self, *args, **kwargs)

        patch.setattr(packstore.PackWriter, "append", append_then_die)
    elif point == "new-pack-sealed":
        close = packstore.PackWriter.close

        def close_then_die(self: packstore.PackWriter) -> None:
            close(self)
            _die()

        patch.setattr(packstore.PackWriter, "close", close_then_die)
    elif point == "old-index-removed":
        unlink = Path.unlink

        def unlink_pack_dies(self: Path, missing_ok: bool = False) -> None:
            if self.suffix == packstore.PACK_SUFFIX:
                _die()
            unlink(self, missing_ok=missing_ok)

        patch.setattr(Path, "unlink", unlink_pack_dies)
    else:
        raise SystemExit(f"gc_killer: unknown point {point!r}")


if __name__ == "__main__":
    arm(sys.argv[1])
    from amb.main import cli

    sys.argv = ["amb", "gc", "--blobs", "--store", sys.argv[2]]
    cli()
    raise SystemExit("gc_killer: gc finished before the chosen point")
