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


def test_links_to_the_mounted_reference_score_nothing_in_the_container(tmp_path, grader_image):
    """In the grader container the reference is mounted at /reference: a submission whose files are
    links to it (dangling on the host, live inside) must not score them; the honest case still does."""
    spec = load_spec("kidney-seg")
    data, work = tmp_path / "data", tmp_path / "work"
    synth(spec, data, cases=2, seed=4)
    perfect_submission(spec, data, work)
    cheat, honest = sorted(p.name for p in (data / "private").iterdir())
    for name in ("organ.nii.gz", "lesion.nii.gz"):
        out = work / "agents_outputs" / cheat / name
        out.unlink()
        out.symlink_to(f"/reference/{cheat}/{name}")
    args = [AMB, "grade", "kidney-seg", "--submission", str(work), "--reference", str(data / "private")]
    env = os.environ | {"AMB_GRADER_IMAGE": grader_image}
    proc = subprocess.run(
        args + ["--json", "--in-container"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    cases = {c["case"]: c for c in json.loads(proc.stdout)["cases"]}
    assert cases[cheat]["status"] == "invalid" and cases[cheat]["score"] == 0.0
    assert "a symbolic link" in cases[cheat]["reason"], cases[cheat]
    assert cases[honest]["status"] == "scored" and cases[honest]["score"] == 1.0


def test_a_built_grader_image_is_used_without_asking_a_registry(tmp_path, grader_image):
    """With the grader image already built (here on the debootstrapped base), `--in-container`
    must use it; it once looked for the default registry base first, and tried to pull it."""
    spec = load_spec("kidney-seg")
    data, work = tmp_path / "data", tmp_path / "work"
    synth(spec, data, cases=1, seed=5)
    perfect_submission(spec, data, work)
    env = {k: v for k, v in os.environ.items() if k not in ("AMB_GRADER_IMAGE", "AMB_BASE_FROM_ROOTFS")}
    # A base no registry has: any attempt to pull it fails, so the test sees one.
    env["AMB_BASE_IMAGE"] = os.environ.get("AMB_BASE_IMAGE") or "amb-test-no-such-base:never"
    args = [AMB, "grade", "kidney-seg", "--submission", str(work), "--reference", str(data / "private")]
    proc = subprocess.run(
        args + ["--in-container", "--json"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0 and "pull" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["score"] == 1.0


def test_a_profile_file_extending_its_neighbour_grades_alike_in_the_image(tmp_path, grader_image):
    spec = load_spec("kidney-seg")
    data, work = tmp_path / "data", tmp_path / "work"
    synth(spec, data, cases=2, seed=3)
    perfect_submission(spec, data, work)
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "base.toml").write_text('extends = "code-2026-04"\n[profile]\nname = "base"\n')
    child = tmp_path / "profiles" / "child.toml"
    child.write_text('extends = "base.toml"\n[profile]\nname = "child"\n')
    args = [AMB, "grade", "kidney-seg", "--submission", str(work), "--reference", str(data / "private")]
    args += ["--json", "--profile", str(child)]
    env = os.environ | {"AMB_GRADER_IMAGE": grader_image}
    local = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    inside = subprocess.run(args + ["--in-container"], capture_output=True, text=True, env=env, timeout=300)
    assert local.returncode == inside.returncode == 0, inside.stderr
    a, b = json.loads(local.stdout), json.loads(inside.stdout)
    assert a["profile"] == b["profile"] == "child" and a["params"] == b["params"]
    assert a["params"]["completeness"] == "all_or_nothing_missing"  # code-2026-04's segmentation gate
    bad = subprocess.run(
        [*args[:-1], str(tmp_path / "profiles" / "missing.toml"), "--in-container"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("amb: error: profile ")
    assert bad.stderr.count("\n") == 1


def test_what_the_container_prints_reaches_the_terminal_escaped(tmp_path, grader_image):
    """The grader's output may quote the submission, the agent's text: a terminal's escape sequence
    in it (here printed by an image whose entry point does only that) is shown, not obeyed."""
    import io

    import docker

    client = docker.from_env()
    printer = (
        "import sys; print('\\x1b]0;pwned\\x07title\\x1b[2J'); print('\\x1b[31mred\\r', file=sys.stderr)"
    )
    dockerfile = f"FROM {grader_image}\nENTRYPOINT {json.dumps(['python', '-c', printer])}\n"
    tag = f"amb-test-printer:{os.getpid()}"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        env = os.environ | {"AMB_GRADER_IMAGE": tag}
        args = [AMB, "grade", "kidney-seg", "--submission", str(tmp_path), "--reference", str(tmp_path)]
        proc = subprocess.run(args + ["--in-container"], capture_output=True, text=True, env=env, timeout=300)
    finally:
        client.images.remove(tag)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "\\x1b]0;pwned\\x07title\\x1b[2J\n"
    assert proc.stderr == "\\x1b[31mred\\r\n"
