"""bench/soak: the soak tests in their long form, as they were specified (tests/soak.py).

The full test command runs each soak test in a short form: the exhaustion agent twice, the engine
sweeps (local docker, SLURM, Ray) over the standard tier. Here ``AMB_SOAK=1`` runs them long: the
exhaustion agent five times, every sweep over both tiers (2 agents x 2 tasks x 2 tiers). Needs what
the tests need (dockerd, the clusters' packages: `.ci/run` starts them). Prints pytest's report; its
wall time is a figure when every test passed, and the exit status is pytest's.

Run: ./just bench soak [pytest arguments, e.g. -k ray]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from bench import figures

SOAK_TESTS = (
    "tests/redteam/test_exhaustion_docker.py",
    "tests/sweeps/test_sweep_docker.py",
    "tests/clusters/test_slurm.py",
    "tests/clusters/test_ray.py",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    figures.add_argument(ap, "soak")
    args, pytest_args = ap.parse_known_args()
    figs = figures.Figures(ap, args)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *SOAK_TESTS, *pytest_args]
    status = subprocess.run(cmd, cwd=HERE, env={**os.environ, "AMB_SOAK": "1"}).returncode
    seconds = time.perf_counter() - t0
    if status == 0 and not pytest_args:
        figs.add(
            "soak",
            "the soak tests in their long form, one process: five exhausting runs, sweeps over both tiers",
            f"**{seconds / 60:.0f} min**, every test passed",
        )
    figs.write()
    print(f"soak: exit {status} after {seconds:.0f} s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
