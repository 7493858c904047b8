"""The build files of amb's container images, shipped inside the package.

``images/<role>/`` holds what a role's image is built from (``agent/`` and ``grader/``: a
Dockerfile and the requirements; ``base/``: the Debian packages of the rootfs base). They are
package data, read through ``importlib.resources``, so a checkout and an installed wheel read
the same bytes and give the same content tags. The build logic is in ``amb/images.py``.
"""

from __future__ import annotations

from importlib import resources


class MissingBuildFile(FileNotFoundError):
    """A build file is absent from this installation (a broken or partial install)."""

    def __init__(self, relative: str, where: str) -> None:
        super().__init__(f"images/{relative}")
        self.relative = f"images/{relative}"
        self.where = where


def read(role: str, name: str) -> bytes:
    """The bytes of ``images/<role>/<name>``; ``MissingBuildFile`` names it when it is absent."""
    path = resources.files(__name__).joinpath(role, name)
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise MissingBuildFile(f"{role}/{name}", str(path)) from None
