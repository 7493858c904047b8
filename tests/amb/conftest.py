"""Fixtures of the CLI tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

AMB = str(Path(sys.executable).parent / "amb")


@pytest.fixture(scope="session")
def amb() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``amb(*args, check=True)``: run the installed ``amb`` command; unless ``check=False``, a
    non-zero exit fails the test with its stderr."""

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([AMB, *args], capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"amb {args} failed ({proc.returncode}): {proc.stderr}")
        return proc

    return run
