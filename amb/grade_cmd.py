"""``amb grade``: score one submission folder against private references.

The command lives in ``scorer.grader.cli`` so the grader image (which has no ``amb`` package) runs the
identical code as ``python -m scorer.grader``.
"""

from __future__ import annotations

from scorer.grader.cli import grade

commands = [grade]
