"""bench/wall: the wall time of whole commands a person runs, each in a fresh clone of this checkout.

- ``demo``: ``./just demo`` in a fresh clone (it makes ``.venv``, builds the agent image if the
  machine has none of this content, records 20 runs over the five tracks, scores and reports them),
  then once more in the same clone, with everything built. Target: under 5 minutes.
- ``ci``: ``CI=true bash .ci/run`` in a fresh clone: the services, the environment, the lint, the
  type check and the whole test suite, as CI runs it. Target: under 12 minutes.

The clone is ``git clone --local`` of this checkout's HEAD (committed work only), in a temporary
directory removed afterwards. The end of a command's output is shown if it fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from bench import figures


def clone(into: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", "--local", str(HERE), str(into)], check=True)
    return into


def timed(argv: list[str], cwd: Path, log: Path, env: dict[str, str]) -> float:
    """Seconds ``argv`` took in ``cwd``; its output appended to ``log``; exit if it failed."""
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        done = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(
            f"bench: {' '.join(argv)} failed (exit {done.returncode}); the end of its output:\n{tail}"
        )
    return seconds


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s" if seconds >= 60 else f"{seconds:.0f} s"


def demo(work: Path, figs: figures.Figures) -> None:
    repo = clone(work / "demo")
    log = work / "demo.log"
    fresh = timed(["./just", "demo"], repo, log, {})
    built = timed(["./just", "demo"], repo, log, {})
    figs.add(
        "demo",
        "`./just demo` from a fresh clone: `.venv`, the agent image, 20 runs over five tracks, scored",
        f"**{minutes(fresh)}**; {minutes(built)} once built",
        target=f"< 5 min ({figures.met(fresh < 300)})",
    )


def ci(work: Path, figs: figures.Figures) -> None:
    repo = clone(work / "ci")
    seconds = timed(["bash", ".ci/run"], repo, work / "ci.log", {"CI": "true"})
    figs.add(
        "ci",
        "`bash .ci/run` in a fresh clone: services, environment, lint, type check, the whole suite",
        f"**{minutes(seconds)}**",
        target=f"< 12 min ({figures.met(seconds < 720)})",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["demo", "ci"], help="time one command only")
    figures.add_argument(ap, "wall")
    args = ap.parse_args()
    figs = figures.Figures(ap, args)
    work = Path(tempfile.mkdtemp(prefix="amb-bench-wall-"))
    work.chmod(0o755)  # as a clone anywhere is: some tests run amb as another user (nobody)
    try:
        if args.only in (None, "demo"):
            demo(work, figs)
        if args.only in (None, "ci"):
            ci(work, figs)
    finally:
        figs.write()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
