"""`amb images build`: content tags, the no-op rebuild, one build at a time, and clear errors."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import uuid

import pytest

from amb.images import (
    ImageError,
    _context_files,
    build_lock,
    content_hash,
    ensure_images,
    lock_path,
    rootfs_tag,
)


def test_content_tag_follows_content() -> None:
    files = _context_files("agent")
    base = content_hash("agent", "sha256:base", files)
    assert content_hash("agent", "sha256:base", dict(files)) == base
    changed = dict(files)
    changed["lib/recorder/shim/wire.py"] = files["lib/recorder/shim/wire.py"] + b"\n# changed\n"
    assert content_hash("agent", "sha256:base", changed) != base
    assert content_hash("agent", "sha256:other-base", files) != base
    # The shim's host-side receiver is not part of the image.
    assert not any(p.endswith("receiver.py") for p in files)


def test_rebuild_with_nothing_changed_is_a_no_op(agent_image: str) -> None:
    again = ensure_images(("agent",), from_rootfs=True)["agent"]
    assert again.cached and again.tag == agent_image


def test_conflicting_options_are_one_line_errors() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from amb.main import cli; cli()",
            "images",
            "build",
            "--base",
            "x",
            "--base-from-rootfs",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "amb: error: --base and --base-from-rootfs exclude each other"


def test_an_images_tag_names_the_base_it_was_built_on(agent_image: str, docker_cli) -> None:
    # The tag's hash covers the base's id, and the build names its base by that id: two processes
    # that once imported two bases under one tag built an image whose tag named the other base.
    base = os.environ.get("AMB_BASE_IMAGE") or rootfs_tag()
    base_id = docker_cli.images.get(base).id
    layers = [h["Id"] for h in docker_cli.images.get(agent_image).history()]
    assert base_id in layers
    assert agent_image == f"amb-agent:c-{content_hash('agent', base_id, _context_files('agent'))}"


_WAITER = """
import sys
from amb.images import docker_client, ensure_tagged

def make(tag):
    sys.exit("made " + tag + " again")

print(ensure_tagged(docker_client(), sys.argv[1], make, log=lambda m: print(m, flush=True)), flush=True)
"""


def test_a_second_amb_waits_for_the_build_and_finds_it_made(
    agent_image: str, docker_cli, tmp_path, monkeypatch
) -> None:
    # A lock of our own (TMPDIR), so that the other test processes' builds do not hold this one.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tag = f"amb-locktest:{uuid.uuid4().hex[:12]}"
    lines: queue.Queue[str] = queue.Queue()
    try:
        with build_lock():
            waiter = subprocess.Popen(
                [sys.executable, "-c", _WAITER, tag],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "TMPDIR": str(tmp_path)},
            )
            out = waiter.stdout
            assert out is not None

            def read() -> None:
                for line in out:
                    lines.put(line)

            threading.Thread(target=read, daemon=True).start()
            said = lines.get(timeout=60)
            assert said.strip() == f"waiting for another amb building images (lock {lock_path()})"
            assert waiter.poll() is None
            # What the first process makes while the second waits: the tag, here on an image at hand.
            docker_cli.images.get(agent_image).tag(tag)
        assert waiter.wait(timeout=60) == 0
        assert lines.get(timeout=10).strip() == tag
    finally:
        docker_cli.images.remove(tag)


def test_an_image_lock_that_is_not_ours_is_one_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = lock_path()
    path.write_bytes(b"")
    os.chown(path, 65534, 65534)  # nobody's: they could hold it forever
    with pytest.raises(ImageError, match=f"the image lock {path} belongs to another user; remove it"):
        with build_lock():
            pass
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ImageError, match=f"cannot open the image lock {path}: Too many levels"):
        with build_lock():
            pass
    assert not (tmp_path / "elsewhere").exists()


def test_the_images_carry_the_bytecode_of_the_code_they_run(agent_image: str, grader_image: str, docker_cli):
    # The images set PYTHONDONTWRITEBYTECODE: without bytecode made at build, each run's shim and each
    # grading would compile every module of amb it imports.
    missing = {}
    for image, root in ((agent_image, "/opt/amb/lib"), (grader_image, "/opt/amb/src")):
        script = f"""
import importlib.util, pathlib
print([str(p) for p in pathlib.Path({root!r}).rglob("*.py")
       if not pathlib.Path(importlib.util.cache_from_source(str(p))).is_file()])
"""
        out = docker_cli.containers.run(
            image, ["python3", "-c", script], remove=True, network_mode="none", user="root"
        )
        missing[image] = out.decode().strip()
    assert missing == {agent_image: "[]", grader_image: "[]"}
