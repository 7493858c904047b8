"""Shared setup for the container tests: a reachable dockerd and the agent image (built once).

These tests never skip: CI starts dockerd first (.ci/dockerd.sh). Without a daemon they fail
with a message that says so. The image is found by content tag, so it is built only when the
Dockerfile, the shim or the base changed. The base comes from a debootstrapped Debian unless
AMB_BASE_IMAGE names a pullable one.
"""

from __future__ import annotations

import os

import pytest

from amb.images import ImageError, docker_client, ensure_images


def require_docker():
    try:
        return docker_client()
    except ImageError as e:
        pytest.fail(f"the container tests need dockerd: {e}", pytrace=False)


@pytest.fixture(scope="session")
def agent_image() -> str:
    require_docker()
    from_rootfs = not os.environ.get("AMB_BASE_IMAGE")
    return ensure_images(("agent",), from_rootfs=from_rootfs)["agent"].tag


@pytest.fixture(scope="session")
def docker_cli():
    return require_docker()


@pytest.fixture(scope="session")
def grader_image() -> str:
    require_docker()
    from_rootfs = not os.environ.get("AMB_BASE_IMAGE")
    return ensure_images(("grader",), from_rootfs=from_rootfs)["grader"].tag
