"""``amb images build``: the agent and grader images, built with the docker SDK, tagged by content.

Every image is tagged ``amb-<role>:c-<hash>`` where the hash covers everything that goes into it
(Dockerfile, requirements, copied sources, the base image's id); ``amb-<role>:latest`` points at the
newest build. The build files come from the ``images`` package (package data, so an installed amb
builds the same images as a checkout). Bases, the build lock and the CA bundle: docs/containers.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path

import click

import images as build_files
from amb.output import table
from schemas.errors import AmbError, UsageError
from schemas.tempdirs import LockFile, NotOurs, tempdir

DEFAULT_BASE = "python:3.11-slim-bookworm"
ROOTFS_SUITE = "bookworm"
ROLES = ("agent", "grader")

SHIM_FILES = tuple(
    f"{module}.py"
    for module in (
        "__init__ __main__ wire notify launch kernel connects seccomp strace watch procpoll oomwatch shim"
    ).split()
)
"""The container side of recorder/shim (stdlib + msgspec only; the receiver stays on the host)."""

GRADER_PACKAGES = ("schemas", "scorer", "tasks")
"""Pure-Python packages the grader runs (copied as sources; the image has no amb CLI deps)."""

GRADER_REPLAY_FILES = ("__init__.py", "arrays.py")
"""The part of ``replay`` the grader runs: the array readers it shares with the viewer's previews."""

SHIPPED_SUFFIXES = frozenset({".py", ".toml", ".md", ".json", ".sql", ".txt", ".html"})
"""The files of a package that go into the grader image: the sources and the package data that
pyproject.toml ships. Choosing by suffix (not "whatever is in the folder") keeps a checkout's
stray files out, so a checkout and an installed wheel give the same content tag."""


class ImageError(AmbError):
    """An image cannot be built, or docker is not reachable."""


@dataclass(frozen=True)
class Built:
    role: str
    tag: str
    image_id: str
    cached: bool


def docker_client():
    """A docker SDK client, or one clear error saying how to get a daemon."""
    import docker

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:
        raise ImageError(
            f"cannot reach a docker daemon ({e.__class__.__name__}: {e}); start one "
            "(CI: .ci/dockerd.sh) or set DOCKER_HOST"
        ) from None
    return client


def build_ca_bundle() -> Path | None:
    """The CA bundle this machine trusts, for package installs inside image builds."""
    for var in ("AMB_BUILD_CA", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    cafile = ssl.get_default_verify_paths().cafile
    return Path(cafile) if cafile and Path(cafile).is_file() else None


def _package_root(package: str) -> Path:
    return Path(str(resources.files(package)))


def _build_file(role: str, name: str) -> bytes:
    try:
        return build_files.read(role, name)
    except build_files.MissingBuildFile as e:
        raise ImageError(
            f"this installation of amb has no {e.relative} (looked for {e.where}); reinstall amb-recorder"
        ) from None


def _context_files(role: str) -> dict[str, bytes]:
    """Every file of a role's build context except the CA bundle: relative path -> bytes."""
    files: dict[str, bytes] = {}
    for name in ("Dockerfile", "requirements.txt"):
        files[name] = _build_file(role, name)
    if role == "agent":
        # `recorder` is a stub package inside the image: only the shim's modules are copied.
        files["lib/recorder/__init__.py"] = (
            b'"""amb recorder (only the in-container shim is installed here)."""\n'
        )
        shim = _package_root("recorder") / "shim"
        for name in SHIM_FILES:
            try:
                files[f"lib/recorder/shim/{name}"] = (shim / name).read_bytes()
            except FileNotFoundError:
                raise ImageError(
                    f"this installation of amb has no recorder/shim/{name} (looked in {shim}); "
                    "reinstall amb-recorder"
                ) from None
    else:
        for package in GRADER_PACKAGES:
            root = _package_root(package)
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix in SHIPPED_SUFFIXES:
                    files[f"src/{package}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
        for name in GRADER_REPLAY_FILES:
            files[f"src/replay/{name}"] = (_package_root("replay") / name).read_bytes()
    return files


def content_hash(role: str, base_id: str, files: dict[str, bytes] | None = None) -> str:
    """The content tag of a role's image: its context files and the base image id."""
    files = _context_files(role) if files is None else files
    h = hashlib.sha256()
    h.update(f"amb-image-v1\0{role}\0{base_id}\0".encode())
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
    return h.hexdigest()[:16]


def _rootfs_packages() -> list[str]:
    lines = _build_file("base", "packages.txt").decode("utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def rootfs_tag() -> str:
    h = hashlib.sha256(f"amb-rootfs-v1\0{ROOTFS_SUITE}\0{','.join(_rootfs_packages())}".encode())
    return f"amb-base:rootfs-{h.hexdigest()[:16]}"


def _import_rootfs(client, tag: str, log=None) -> None:
    """Debootstrap a minimal Debian with python3 and strace, import it as ``tag``."""
    if shutil.which("debootstrap") is None:
        raise ImageError("--base-from-rootfs needs debootstrap (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise ImageError("--base-from-rootfs needs root (debootstrap creates device nodes and owners)")
    with tempdir("amb-rootfs-") as tmp:
        rootfs = tmp / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(_rootfs_packages())}",
            ROOTFS_SUITE,
            str(rootfs),
        ]
        mirror = os.environ.get("AMB_DEBIAN_MIRROR")
        if mirror:
            cmd.append(mirror)
        _say(log, f"debootstrap {ROOTFS_SUITE} (about a minute)")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            raise ImageError(f"debootstrap failed (exit {proc.returncode}): {tail}")
        # Smaller image, and no apt lists that would go stale inside it.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        tarball = tmp / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        _say(log, f"docker import -> {tag}")
        repo, _, version = tag.partition(":")
        with open(tarball, "rb") as f:
            client.api.import_image_from_data(f, repository=repo, tag=version)


def ensure_public_base(client, base: str, log=None) -> str:
    import docker.errors

    if find_image(client, base) is None:
        _say(log, f"pulling {base}")
        try:
            client.images.pull(base)
        except docker.errors.APIError as e:
            raise ImageError(
                f"cannot pull base image {base}: {e.explanation or e}; without a registry use "
                "`amb images build --base-from-rootfs`"
            ) from None
    return base


def lock_path() -> Path:
    """The image lock of this user on this machine (one docker engine per machine, as a rule)."""
    return Path(tempfile.gettempdir()) / f"amb-images-{os.geteuid()}.lock"


@contextlib.contextmanager
def build_lock(log=None) -> Iterator[None]:
    """Held while an image is built or a base imported; another amb waits, then finds it built. The
    file goes with its last holder (``schemas.tempdirs.LockFile``; ``amb gc`` removes one left free)."""
    path = lock_path()
    try:
        # No link followed, and only a file of our own: another user's file could be held forever.
        held = LockFile(
            path, on_wait=lambda: _say(log, f"waiting for another amb building images (lock {path})")
        )
    except NotOurs:
        raise ImageError(f"the image lock {path} belongs to another user; remove it") from None
    except OSError as e:
        raise ImageError(f"cannot open the image lock {path}: {e.strerror}") from None
    try:
        yield
    finally:
        held.release()


def ensure_tagged(client, tag: str, make: Callable[[str], None], log=None) -> str:
    """``tag`` exists when this returns: found, or made by ``make(tag)`` under the build lock once
    the lock shows that no other process made it while this one waited."""
    if find_image(client, tag) is None:
        with build_lock(log):
            if find_image(client, tag) is None:
                make(tag)
                client.images.get(tag)  # not found here: ``make`` did not make it (a bug, not a race)
    return tag


def find_image(client, ref: str):
    """The image ``ref`` names on this engine, or None."""
    import docker.errors

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def ensure_image(client, role: str, base: str, *, log=None) -> Built:
    """Build ``role`` on ``base`` unless an image with the same content tag exists."""
    if role not in ROLES:
        raise UsageError(f"unknown image role {role!r} (expected one of {', '.join(ROLES)})")
    base_id = client.images.get(base).id
    files = _context_files(role)
    tag = f"amb-{role}:c-{content_hash(role, base_id, files)}"
    built = False

    def build(tag: str) -> None:
        nonlocal built
        built = True
        _build(client, role, tag, files, base, base_id, log)

    ensure_tagged(client, tag, build, log)
    image = client.images.get(tag)
    image.tag(f"amb-{role}", "latest")
    return Built(role, tag, image.id, cached=not built)


def _build(client, role: str, tag: str, files: dict[str, bytes], base: str, base_id: str, log) -> None:
    import docker.errors

    with tempdir(f"amb-{role}-ctx-") as tmp:
        for rel, data in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        # An empty bundle makes pip fall back to failing loudly on TLS, which is the honest outcome
        # when the machine has no CA bundle at all.
        ca = build_ca_bundle()
        (tmp / "build-ca.pem").write_bytes(ca.read_bytes() if ca else b"")
        _say(log, f"building {tag} on {base}")
        last: list[str] = []
        try:
            for chunk in client.api.build(
                path=str(tmp),
                tag=tag,
                # By id: the tag's hash covers this base, whatever the base's tag points at by now.
                buildargs={"BASE": base_id},
                rm=True,
                forcerm=True,
                decode=True,
                labels={"org.amb.content": tag.split(":c-")[1]},
            ):
                if "error" in chunk:
                    raise ImageError(
                        f"building {tag} failed: {chunk['error'].strip()} "
                        f"(last output: {' | '.join(last[-3:])})"
                    )
                line = chunk.get("stream", "").strip()
                if line:
                    last.append(line)
                    if line.startswith("Step "):
                        _say(log, f"  {line}")
        except docker.errors.APIError as e:
            raise ImageError(f"building {tag} failed: {e.explanation or e}") from None


def find_built(role: str) -> Built | None:
    """An image of ``role`` built from the current sources on a base that is already here, if any:
    no pull and no build, so an image built on either base serves without asking a registry."""
    import docker.errors

    client = docker_client()
    files = _context_files(role)
    for base in (rootfs_tag(), os.environ.get("AMB_BASE_IMAGE") or DEFAULT_BASE):
        try:
            base_id = client.images.get(base).id
            tag = f"amb-{role}:c-{content_hash(role, base_id, files)}"
            image = client.images.get(tag)
        except docker.errors.ImageNotFound:
            continue
        return Built(role, tag, image.id, cached=True)
    return None


def ensure_images(
    roles: tuple[str, ...] = ROLES, *, base: str | None = None, from_rootfs: bool | None = None, log=None
) -> dict[str, Built]:
    """Make sure the images exist; return them by role. Without an explicit choice the base comes
    from the rootfs when ``AMB_BASE_FROM_ROOTFS=1``, else from ``AMB_BASE_IMAGE`` or the default."""
    client = docker_client()
    if from_rootfs is None:
        from_rootfs = os.environ.get("AMB_BASE_FROM_ROOTFS", "") not in ("", "0") and base is None
    if from_rootfs:
        base_ref = ensure_tagged(client, rootfs_tag(), lambda tag: _import_rootfs(client, tag, log), log)
    else:
        base_ref = ensure_public_base(client, base or os.environ.get("AMB_BASE_IMAGE") or DEFAULT_BASE, log)
    return {role: ensure_image(client, role, base_ref, log=log) for role in roles}


def _say(log, message: str) -> None:
    if log is not None:
        log(message)


@click.group("images")
def images() -> None:
    """Container images for the docker backend (agent) and the offline grader."""


@images.command("build")
@click.option(
    "--base-from-rootfs",
    is_flag=True,
    help="Make the base from a debootstrapped Debian (no registry needed).",
)
@click.option(
    "--base", "base", default=None, help=f"Base image (default: $AMB_BASE_IMAGE or {DEFAULT_BASE})."
)
@click.option("--only", type=click.Choice(ROLES), multiple=True, help="Build only these roles.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def build(base_from_rootfs: bool, base: str | None, only: tuple[str, ...], as_json: bool) -> None:
    """Build (or find, by content tag) the agent and grader images."""
    if base_from_rootfs and base:
        raise UsageError("--base and --base-from-rootfs exclude each other")
    log = partial(click.echo, err=True)
    built = ensure_images(only or ROLES, base=base, from_rootfs=base_from_rootfs or None, log=log)
    if as_json:
        click.echo(json.dumps({r: b.__dict__ for r, b in built.items()}, indent=2))
        return
    rows = [(b.role, b.tag, "up to date" if b.cached else "built") for b in built.values()]
    click.echo(table(("role", "tag", "state"), rows))


commands = [images]
