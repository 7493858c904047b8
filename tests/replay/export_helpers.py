"""Helpers for the export tests: a store with recorded-style and imported runs, the outside
validators (Harbor's TrajectoryValidator from its unpacked wheel, the ``atif`` package), and the
memory an export of a big run takes."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

from click.testing import CliRunner, Result

from amb.main import cli
from recorder.synthetic import generate_run
from replay.ingest import ingest

HARBOR = "harbor==0.26.0"
HARBOR_DIR = Path(sys.prefix) / "amb-test-wheels" / "harbor-0.26.0"


def harbor_validator_class():
    """Harbor's own ``TrajectoryValidator``.

    Every ``harbor`` release requires Python >= 3.12 (the project runs 3.11), so it cannot be
    installed; its trajectory models and validator only need pydantic, so the unpacked wheel goes on
    ``sys.path`` (fetched once per virtual environment with pip, from the package index)."""
    if not (HARBOR_DIR / "harbor" / "utils" / "trajectory_validator.py").is_file():
        wheels = HARBOR_DIR.parent / "dl"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--disable-pip-version-check",
                HARBOR,
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                "-d",
                str(wheels),
            ],
            check=True,
        )
        wheel = next(wheels.glob("harbor-0.26.0-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(HARBOR_DIR)
    if str(HARBOR_DIR) not in sys.path:
        sys.path.insert(0, str(HARBOR_DIR))
    from harbor.utils.trajectory_validator import (  # on sys.path at run time
        TrajectoryValidator,
    )

    return TrajectoryValidator


def export_of_a_big_run(tmp_path: Path, *args: str) -> tuple[Result, int]:
    """``amb export ARGS... --store STORE`` of a run ``many`` of tens of thousands of events (most of
    them processes, in no model call's conversation), and the peak of Python's allocations while
    it ran (tracemalloc)."""
    root = tmp_path / "store"
    generate_run(root, "many", seed=1, calls=2, processes_per_call=10_000)
    ingest(root)
    tracemalloc.start()
    try:
        result = CliRunner().invoke(cli, ["export", *args, "--store", str(root)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak
