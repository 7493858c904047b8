"""`amb grade --in-container` runs the same grader in the grader image and gives the same result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.registry import load_spec
from tasks.synth import perfect_submission, synth

AMB = str(Path(sys.executable).parent / "amb")


@pytest.mark.parametrize("task", ["kidney-seg", "bccd-det"])
def test_same_result_in_the_grader_image(tmp_path, grader_image, task):
    spec = load_spec(task)
    data, work = tmp_path / "data", tmp_path / "work"
    synth(spec, data, cases=2, seed=3)
    perfect_submission(spec, data, work)
    # One case degraded, so the comparison covers a score below 1 and a reason.
    victims = sorted(p for p in work.rglob("*") if p.is_file() and "agents_outputs" in p.parts)
    victims[0].write_bytes(b"not what the grader expects")
    args = [AMB, "grade", task, "--submission", str(work), "--reference", str(data / "private"), "--json"]
    env = os.environ | {"AMB_GRADER_IMAGE": grader_image}
    local = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    inside = subprocess.run(args + ["--in-container"], capture_output=True, text=True, env=env, timeout=300)
    assert local.returncode == inside.returncode == 0, inside.stderr
    # Library messages may quote the file's absolute path, which differs inside the container.
    a = json.loads(local.stdout.replace(str(work), "<submission>"))
    b = json.loads(inside.stdout.replace("/submission", "<submission>"))
    assert a["cases"] == b["cases"] and a["score"] == b["score"] and 0 < a["score"] < 1
    assert any(c["reason"] for c in a["cases"])


def test_without_docker_engine_it_is_one_clear_error(tmp_path):
    env = os.environ | {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    proc = subprocess.run(
        [
            AMB,
            "grade",
            "kidney-seg",
            "--submission",
            str(tmp_path),
            "--reference",
            str(tmp_path),
            "--in-container",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stderr.startswith("amb: error: --in-container needs a Docker engine")
    assert "Traceback" not in proc.stderr
