"""What a container sees of a task's public data: a view that does not say where the data lives.

The docker backend mounts ``DIR/public`` at ``/data/public``. A bind mount of that folder would show
its host path in the container's ``/proc/self/mountinfo``; the view is instead a tree of hard links
to it inside the run's temp directory, which names only that directory. Where links cannot be made
(another filesystem, files of another user without root) the folder itself is mounted, and the
run's ``tool_versions.data_view`` says so.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple


class DataView(NamedTuple):
    mount: Path
    """What to mount at /data/public."""
    how: str
    """``linked``, or ``bind (...)`` with why links could not be made."""


def public_view(public: Path, tmp: Path) -> DataView:
    """The view of ``public`` to mount, made in ``tmp`` (the run's temp directory) when it can be."""
    view = tmp / "public"
    try:
        _link_tree(public.resolve(), view)
        return DataView(view, "linked")
    except OSError as e:
        shutil.rmtree(view, ignore_errors=True)
        return DataView(
            public.resolve(), f"bind (its host path shows in the container's mountinfo: {e.strerror or e})"
        )


def _link_tree(src: Path, dst: Path) -> None:
    """Recreate ``src`` at ``dst``: directories made, files hard-linked, symbolic links copied as
    links (they are resolved inside the container, where they cannot reach the host)."""
    dst.mkdir()
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        for name in dirnames + filenames:
            s, d = Path(dirpath) / name, dst / rel / name
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
            elif s.is_dir():
                d.mkdir()
            else:
                os.link(s, d, follow_symlinks=False)
