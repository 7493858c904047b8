"""``amb grade``: score one submission folder against private references.

The command itself lives in ``scorer.grader.cli`` so that the grader image (which has no ``amb``
package) runs the identical code as ``python -m scorer.grader``. This module adds one option,
``--in-container``: run that same entry point inside the grader image, with no network, the
submission and the references mounted read-only and a read-only root filesystem.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import click

from schemas.display import relay
from schemas.errors import AmbError
from scorer.grader.cli import grade as local_grade
from scorer.profile import load_options


def _image() -> str:
    if os.environ.get("AMB_GRADER_IMAGE"):
        return os.environ["AMB_GRADER_IMAGE"]
    from amb.images import ensure_images, find_built

    built = find_built("grader")  # already built: never a registry round trip for its base
    return built.tag if built is not None else ensure_images(("grader",))["grader"].tag


def grade_in_container(
    task_id: str, submission: str, reference: str, profile: str | None, as_json: bool
) -> int:
    """Run ``python -m scorer.grader`` in the grader image; print its output, each line with nothing
    a terminal would obey (``schemas.display.relay``); return its exit code."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        raise AmbError(f"--in-container needs a Docker engine, and none answers: {e}") from None
    sub, ref = Path(submission).resolve(), Path(reference).resolve()
    for what, path in (("submission", sub), ("reference", ref)):
        if not path.is_dir():
            raise AmbError(f"{what} {path} is not a directory")
    volumes = {
        str(sub): {"bind": "/submission", "mode": "ro"},
        str(ref): {"bind": "/reference", "mode": "ro"},
    }
    argv = ["python", "-m", "scorer.grader", task_id]
    argv += ["--submission", "/submission", "--reference", "/reference"]
    if profile:
        load_options(profile)  # a bad profile is one line here, before a container starts
    if profile and Path(profile).is_file():
        # Its folder, so that an `extends` of a file beside it resolves in the container too.
        # (A folder already mounted, the submission's or the references', is reused where it is.)
        path = Path(profile).resolve()
        mount = volumes.setdefault(str(path.parent), {"bind": "/profile", "mode": "ro"})
        argv += ["--profile", f"{mount['bind']}/{path.name}"]
    elif profile:
        argv += ["--profile", profile]
    if as_json:
        argv.append("--json")
    container = client.containers.run(
        _image(),
        argv,
        detach=True,
        network_mode="none",
        read_only=True,
        volumes=volumes,
        tmpfs={"/tmp": "size=256m"},
        security_opt=["no-new-privileges"],
        cap_drop=["ALL"],
    )
    try:
        code = container.wait()["StatusCode"]
        # What the grader prints may quote the submission (the agent's text): escaped for a terminal.
        relay(io.BytesIO(container.logs(stdout=True, stderr=False)), sys.stdout)
        relay(io.BytesIO(container.logs(stdout=False, stderr=True)), sys.stderr)
    finally:
        container.remove(force=True)
    return code


def _grade(in_container: bool, **kwargs) -> None:
    if not in_container:
        assert local_grade.callback is not None
        return local_grade.callback(**kwargs)
    if code := grade_in_container(**kwargs):
        sys.exit(code)


grade = click.Command(
    name="grade",
    callback=_grade,
    params=[
        *local_grade.params,
        click.Option(
            ["--in-container"],
            is_flag=True,
            help="Grade inside the grader image: no network, inputs read-only (needs a Docker engine).",
        ),
    ],
    help=local_grade.help,
    short_help=local_grade.short_help,
)

commands = [grade]
