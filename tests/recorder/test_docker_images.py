"""`amb images build`: content tags, the no-op rebuild, and clear errors."""

from __future__ import annotations

import subprocess
import sys

from amb.images import _context_files, content_hash, ensure_images


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
