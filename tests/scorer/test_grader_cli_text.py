"""``python -m scorer.grader`` prints text it does not control (an exception's message, a path, a
model's error about the agent's text) through the terminal-escaping helper: its ``degraded:`` line
and its ``amb: error:`` line hold nothing a terminal would obey, each on one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tasks.registry import load_spec
from tasks.synth import perfect_submission, synth

HOSTILE = "w\x1b]0;owned\x07\x1b[2J\nnext"


def _grader(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scorer.grader", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_the_degraded_line_escapes_what_it_quotes(tmp_path):
    spec = load_spec("ldct-denoising")
    data = tmp_path / "d"
    synth(spec, data, 2, 0)
    perfect_submission(spec, data, tmp_path / "ws")
    weights = tmp_path / f"{HOSTILE}.npz"  # the LPIPS network is named, so its failure quotes the name
    args = ["ldct-denoising", "--submission", str(tmp_path / "ws"), "--reference", str(data / "private")]
    proc = _grader(*args, "--profile", "code-2026-04", env={"AMB_LPIPS_WEIGHTS": str(weights)})
    assert proc.returncode == 0, proc.stderr
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("degraded: ")]
    assert line.startswith("degraded: LPIPS: not computed, LPIPS weights "), line
    assert "\\x1b]0;owned\\x07\\x1b[2J\\nnext.npz" in line, line
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout


def test_the_error_line_escapes_what_it_quotes(tmp_path):
    spec = load_spec("ldct-denoising")
    data = tmp_path / "d"
    synth(spec, data, 1, 0)
    missing = tmp_path / HOSTILE
    proc = _grader("ldct-denoising", "--submission", str(missing), "--reference", str(data / "private"))
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert proc.stderr.startswith("amb: error: submission ") and proc.stderr.endswith(
        "\\x1b]0;owned\\x07\\x1b[2J\\nnext: not a directory\n"
    ), proc.stderr
    assert Path(missing).name == HOSTILE
