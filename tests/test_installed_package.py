"""The installed package is the product: the wheel and the sdist, each installed into a fresh virtual
environment outside the source tree, run the main job from a directory with no checkout in reach.

The wheel's installation runs every command in order: `amb --version`, `amb doctor`,
`amb images build --base-from-rootfs` (finding the images current, with the same content tags as the
checkout computes), `amb demo` on the docker backend, `amb grade --in-container` on a submission the
demo's agent made; and a build file taken out of the installation is one clear error naming it.
The sdist's installation must hold the very same files, byte for byte, and the same commands (so
the main job, run once, holds for both), and answer `amb --version` and `amb doctor` itself.

Speed: the demo runs once (it takes minutes). The distributions are built once (`python -m build
--no-isolation`: the sdist, then the wheel from the sdist). The fresh environments have amb's own
files from the distribution, and borrow the third-party packages of the environment running the
tests (a path entry, read-only) instead of downloading ~1 GB of wheels twice; `pip check` then
proves the distribution's declared requirements are met by what is there, and nothing of the
checkout is importable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from amb.images import ROLES, content_hash, docker_client, rootfs_tag

# Minutes: builds the wheel and the sdist, installs them, runs the demo on the docker backend.
pytestmark = pytest.mark.long(minutes=9)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("amb", "agents", "images", "recorder", "replay", "schemas", "scorer", "tasks")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _run(cmd: list[str], *, timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    proc = _run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("amb_recorder-*.whl")
    (sdist,) = out.glob("amb_recorder-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


class Installed:
    """A fresh virtual environment with one distribution of amb installed, and a place to run it."""

    def __init__(self, root: Path, dist: Path) -> None:
        self.venv = root / "venv"
        self.work = root / "work"
        self.work.mkdir()
        proc = _run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], timeout=120)
        assert proc.returncode == 0, proc.stderr
        self.python = self.venv / "bin" / "python"
        self.site = Path(
            _run(
                [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                timeout=60,
            ).stdout.strip()
        )
        # Third-party packages from the test environment (its .pth files, among them the checkout's
        # editable install, are not processed for a path added this way).
        (self.site / "amb-test-borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        pip = [sys.executable, "-m", "pip", "--python", str(self.python), "--disable-pip-version-check"]
        proc = _run(
            [
                *pip,
                "install",
                "--no-index",
                "--no-deps",
                "--no-build-isolation",
                "--force-reinstall",
                str(dist),
            ],
            timeout=600,
            cwd=self.work,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        check = _run([*pip, "check"], timeout=120, cwd=self.work)
        assert check.returncode == 0, check.stdout + check.stderr
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("AMB_", "PYTHON", "VIRTUAL_ENV"))
        }
        self.env["PATH"] = f"{self.venv / 'bin'}:{SYSTEM_PATH}"
        self.env["HOME"] = str(root)
        if os.environ.get("AMB_BASE_IMAGE"):
            self.env["AMB_BASE_IMAGE"] = os.environ["AMB_BASE_IMAGE"]
        else:
            self.env["AMB_BASE_FROM_ROOTFS"] = "1"  # no registry needed (as the container tests)

    def amb(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return _run([str(self.venv / "bin" / "amb"), *args], timeout=timeout, cwd=self.work, env=self.env)


def _sealed_submission(store: Path, run_id: str, into: Path) -> Path:
    from replay.read import iter_events
    from replay.store import Store
    from scorer.taskgrade import materialise
    from scorer.trajectory import fold

    st = Store.open(store, read_only=True)
    try:
        traj = fold(run_id, list(iter_events(st.con, run_id)), st.blobs.get)
        into.mkdir()
        assert materialise(traj, st.blobs.get, into) == []
    finally:
        st.close()
    assert any(into.rglob("*.nii.gz")), sorted(into.rglob("*"))
    return into


def _expected_tags() -> dict[str, str]:
    """The content tags the checkout computes for the images on the base the installs use."""
    client = docker_client()
    base = os.environ.get("AMB_BASE_IMAGE") or rootfs_tag()
    base_id = client.images.get(base).id
    return {role: f"amb-{role}:c-{content_hash(role, base_id)}" for role in ROLES}


def _installed_files(inst: Installed) -> dict[str, bytes]:
    """What pip put into the environment for amb: its packages and metadata under site-packages (less
    the compiled caches and the two files that name where the distribution came from) and its
    commands (with the environment's own path taken out of their first lines)."""
    files: dict[str, bytes] = {}
    for path in sorted(inst.site.rglob("*")):
        rel = path.relative_to(inst.site)
        if not path.is_file() or "__pycache__" in rel.parts:
            continue
        if rel.parts[0].endswith(".dist-info") and rel.name in ("RECORD", "direct_url.json"):
            continue
        files[f"site/{rel}"] = path.read_bytes()
    for command in ("amb", "amb-record", "amb-agent"):
        script = (inst.venv / "bin" / command).read_bytes()
        files[f"bin/{command}"] = script.replace(str(inst.venv).encode(), b"<venv>")
    return files


@pytest.fixture(scope="module")
def wheel_installed(dists, tmp_path_factory) -> tuple[Installed, dict[str, bytes]]:
    """The wheel's installation and its files as pip left them (the main job later breaks one)."""
    inst = Installed(tmp_path_factory.mktemp("installed-wheel"), dists["wheel"])
    return inst, _installed_files(inst)


def test_the_sdist_installs_what_the_wheel_installs(dists, wheel_installed, tmp_path_factory):
    inst = Installed(tmp_path_factory.mktemp("installed-sdist"), dists["sdist"])
    from_sdist, from_wheel = _installed_files(inst), wheel_installed[1]
    assert sorted(from_sdist) == sorted(from_wheel)
    assert [name for name in from_wheel if from_sdist[name] != from_wheel[name]] == []
    assert any(name.startswith("site/images/agent/") for name in from_wheel)  # package data went along
    version = inst.amb("--version")
    assert version.returncode == 0 and version.stdout.startswith("amb 0.1.0 (amb-recorder"), version.stderr
    doctor = inst.amb("doctor", "--json", timeout=60)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["installation"]["status"] == "ok" and str(inst.site) in checks["installation"]["detail"]


def test_the_installed_package_runs_the_main_job(wheel_installed):
    timings: dict[str, float] = {}
    inst = wheel_installed[0]

    # Nothing of the checkout is in reach: every package comes from the fresh environment.
    where = _run(
        [
            str(inst.python),
            "-c",
            f"import {', '.join(PACKAGES)}; print('\\n'.join(m.__file__ for m in ({', '.join(PACKAGES)})))",
        ],
        timeout=60,
        cwd=inst.work,
        env=inst.env,
    )
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert Path(path).is_relative_to(inst.site), f"{path} is not from the installed package"

    version = inst.amb("--version")
    assert version.returncode == 0 and version.stdout.startswith("amb 0.1.0 (amb-recorder"), version.stderr
    assert re.search(r"events: writes v\d+ ", version.stdout), version.stdout
    assert "store: migration level core." in version.stdout

    t = time.monotonic()
    doctor = inst.amb("doctor", "--json", timeout=60)
    timings["doctor"] = time.monotonic() - t
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["installation"]["status"] == "ok" and str(inst.site) in checks["installation"]["detail"]
    assert checks["docker engine"]["status"] == "ok"

    t = time.monotonic()
    build = inst.amb("images", "build", "--base-from-rootfs", "--json", timeout=1800)
    timings["images build"] = time.monotonic() - t
    assert build.returncode == 0, build.stderr[-3000:]
    built = json.loads(build.stdout)
    # Same bytes, same tags: the installed package builds (or finds) the images the checkout would.
    assert {role: b["tag"] for role, b in built.items()} == _expected_tags()

    t = time.monotonic()
    # One tier: every track's task and both agents, half the runs of the full demo (the minutes of
    # this test are the demo's; the tiers differ only in the brief the agent reads).
    demo = inst.amb("demo", "--backend", "docker", "--tier", "lite", timeout=1800)
    timings["demo"] = time.monotonic() - t
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "docker backend, with the shim" in demo.stderr
    assert "recording 10 runs (2 agents x 5 tasks x 1 tiers)" in demo.stderr
    assert "== the runs, their hash chains" in demo.stdout
    page = (inst.work / "out" / "demo-report.html").read_text(encoding="utf-8")
    # The baseline has no price: the report says why, and plots tokens instead.
    assert "Why a cost is unknown" in page and "not in price table" in page and "tokens vs OVERALL" in page
    query = "SELECT run_id, task, tier, agent, model, backend, status FROM runs"
    runs = json.loads(inst.amb("sql", query, "--format", "json", "--store", "out/demo-store").stdout)
    assert len(runs) == 10 and {r["backend"] for r in runs} == {"docker"}
    assert {r["task"] for r in runs} == {
        "kidney-seg",
        "ldct-denoising",
        "vqa-rad",
        "mimic-cxr-report",
        "bccd-det",
    }
    assert {r["tier"] for r in runs} == {"lite"}
    # The agent and the model as the sweep named them (the binary stays in the command).
    assert {(r["agent"], r["model"]) for r in runs} == {
        ("baseline", "baseline"),
        ("baseline-crash", "baseline+crash-mid-batch"),
    }

    run = next(
        r
        for r in runs
        if r["task"] == "kidney-seg" and r["agent"] == "baseline" and r["status"] == "completed"
    )
    # The submission the agent sealed in its container, as the scorer reads it back from the store.
    submission = _sealed_submission(inst.work / "out" / "demo-store", run["run_id"], inst.work / "submission")
    reference = inst.work / "out" / "demo" / "data" / "kidney-seg" / "private"
    assert reference.is_dir()
    t = time.monotonic()
    grade = inst.amb(
        "grade",
        "kidney-seg",
        "--submission",
        str(submission),
        "--reference",
        str(reference),
        "--in-container",
        "--json",
    )
    timings["grade --in-container"] = time.monotonic() - t
    assert grade.returncode == 0, grade.stderr[-3000:]
    graded = json.loads(grade.stdout)
    assert 0 < graded["score"] <= 1 and len(graded["cases"]) == 4

    # A build file missing from the installation: one line naming it, never a traceback.
    (inst.site / "images" / "base" / "packages.txt").unlink()
    broken = inst.amb("images", "build", "--base-from-rootfs")
    assert broken.returncode != 0 and "Traceback" not in broken.stderr
    assert broken.stderr.startswith("amb: error: this installation of amb has no images/base/packages.txt")
    doctor = inst.amb("doctor", "--json", timeout=60)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert doctor.returncode == 1 and "images/base/packages.txt" in checks["installation"]["detail"]

    print("wheel: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    shutil.rmtree(inst.work / "out", ignore_errors=True)
