"""`amb doctor` names each missing requirement: no dockerd, no debootstrap, no Chromium, no store.

Each case takes one requirement away from this machine (a dead DOCKER_HOST socket, a PATH without
the tool, a store path that cannot be a directory) and checks that doctor names that one and only
that one. The machine itself has them all (CI: .ci/dockerd.sh, .ci/chromium.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recorder.ordinary_user import require_reachable_checkout

AMB = str(Path(sys.executable).parent / "amb")


def tool_dir(tmp_path: Path, without: str) -> str:
    """A PATH that has this machine's tools doctor looks for, except ``without``."""
    bin_dir = tmp_path / f"bin-without-{without}"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("debootstrap", "chromium", "tar", "unshare"):
        found = shutil.which(tool)
        assert found, f"this test needs {tool} on the machine (CI installs it)"
        if tool != without and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    return os.pathsep.join([str(Path(sys.executable).parent), str(bin_dir)])


def doctor(tmp_path: Path, *args: str, **env: str) -> tuple[int, dict[str, dict]]:
    """`amb doctor --json` in this process (as a user runs it, minus the interpreter's start)."""
    from click.testing import CliRunner

    from amb.main import cli

    full_env = {"AMB_STORE": str(tmp_path / "store")} | env
    result = CliRunner().invoke(cli, ["doctor", "--json", *args], env=full_env, catch_exceptions=False)
    data = json.loads(result.stdout)
    return result.exit_code, {c["name"]: c for c in data["checks"]}


def not_ok(checks: dict[str, dict]) -> set[str]:
    return {name for name, c in checks.items() if c["status"] in ("warn", "fail")}


def test_everything_present(tmp_path):
    code, checks = doctor(tmp_path, PATH=tool_dir(tmp_path, without="nothing"))
    for name in ("installation", "docker engine", "docker permission", "base image", "debootstrap"):
        assert checks[name]["status"] == "ok", checks[name]
    for name in ("CA bundle", "store", "process isolation", "chromium"):
        assert checks[name]["status"] == "ok", checks[name]
    assert "Docker " in checks["docker engine"]["detail"] and "GiB free" in checks["store"]["detail"]
    assert checks["judge endpoint"]["status"] == "skip"
    assert code == 0


def test_no_dockerd(tmp_path):
    dead = f"unix://{tmp_path}/no-docker.sock"
    code, checks = doctor(tmp_path, DOCKER_HOST=dead, PATH=tool_dir(tmp_path, without="nothing"))
    assert code == 1
    assert checks["docker engine"]["status"] == "fail"
    assert dead in checks["docker engine"]["detail"] and "DOCKER_HOST" in checks["docker engine"]["fix"]
    # What depends on the engine is not guessed at; what does not is still checked.
    assert {checks[n]["status"] for n in ("base image", "agent image", "grader image")} == {"skip"}
    assert not_ok(checks) == {"docker engine"}


def test_no_docker_permission(tmp_path):
    # Root may use any socket, so the user without the permission is a real one: nobody, who is
    # not in the docker group, asks the engine this machine runs.
    require_reachable_checkout()
    setpriv = shutil.which("setpriv")
    assert setpriv, "this test needs setpriv (util-linux)"
    tmp_path.chmod(0o777)
    env = os.environ | {"AMB_STORE": str(tmp_path / "store"), "HOME": str(tmp_path)}
    env.pop("DOCKER_HOST", None)
    proc = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", AMB, "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert proc.returncode == 1
    assert checks["docker permission"]["status"] == "fail"
    assert "permission denied" in checks["docker permission"]["detail"]
    assert "docker group" in checks["docker permission"]["fix"]
    assert checks["docker engine"]["status"] == "skip"


def test_no_debootstrap(tmp_path):
    code, checks = doctor(tmp_path, PATH=tool_dir(tmp_path, without="debootstrap"))
    assert checks["debootstrap"]["status"] in ("warn", "fail")
    assert "debootstrap is not on PATH" in checks["debootstrap"]["detail"]
    assert "apt-get install debootstrap" in checks["debootstrap"]["fix"]
    assert not_ok(checks) <= {"debootstrap", "agent image", "grader image"}
    assert "debootstrap" in not_ok(checks)


def test_no_chromium(tmp_path):
    code, checks = doctor(tmp_path, PATH=tool_dir(tmp_path, without="chromium"))
    assert checks["chromium"]["status"] == "warn"
    assert "no Chromium on PATH" in checks["chromium"]["detail"]
    assert not_ok(checks) <= {"chromium", "agent image", "grader image"}
    assert "chromium" in not_ok(checks)


def test_no_unshare(tmp_path):
    code, checks = doctor(tmp_path, PATH=tool_dir(tmp_path, without="unshare"))
    check = checks["process isolation"]
    assert check["status"] == "warn" and "`unshare` (util-linux) is not on PATH" in check["detail"]
    assert "apt-get install util-linux" in check["fix"]
    assert not_ok(checks) <= {"process isolation", "agent image", "grader image"}


def test_user_namespaces_refused(tmp_path):
    # The kernel refuses: a user namespace of the test's in which none may be made (what
    # user.max_user_namespaces = 0 does on a host).
    limit = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    argv = ["unshare", "--user", "--map-root-user", "sh", "-c", limit, "sh", AMB, "doctor", "--json"]
    env = os.environ | {"AMB_STORE": str(tmp_path / "store")}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    check = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["process isolation"]
    assert check["status"] == "warn" and "No space left on device" in check["detail"], check
    assert "user.max_user_namespaces" in check["fix"] and "--backend docker" in check["fix"]


@pytest.mark.parametrize("layout", ["file-in-place", "under-a-file"])
def test_unwritable_store(tmp_path, layout):
    # Tests run as root, who may write anywhere a mode bit forbids: a file where the store's
    # directory would be (or would have to be made) is what stops root too.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    store = blocker if layout == "file-in-place" else blocker / "store"
    code, checks = doctor(tmp_path, AMB_STORE=str(store), PATH=tool_dir(tmp_path, without="nothing"))
    assert code == 1
    assert checks["store"]["status"] == "fail"
    assert str(blocker) in checks["store"]["detail"] and "not a directory" in checks["store"]["detail"]
    assert not_ok(checks) <= {"store", "agent image", "grader image"}


def test_read_only_store(tmp_path):
    # A read-only file system stops root: a read-only bind mount of an empty directory.
    target = tmp_path / "ro-store"
    target.mkdir()
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(target), str(target)], capture_output=True)
    assert mounted.returncode == 0, f"this test needs root to make a read-only bind mount: {mounted.stderr!r}"
    try:
        code, checks = doctor(tmp_path, AMB_STORE=str(target), PATH=tool_dir(tmp_path, without="nothing"))
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert code == 1 and checks["store"]["status"] == "fail"
    assert "Read-only file system" in checks["store"]["detail"]


def test_judge_llm_variables(tmp_path):
    env = {v: "" for v in ("AMB_JUDGE_BASE_URL", "AMB_JUDGE_API_KEY", "AMB_JUDGE_MODEL")}
    code, checks = doctor(tmp_path, "--judge", "llm", PATH=tool_dir(tmp_path, without="nothing"), **env)
    assert code == 1 and checks["judge endpoint"]["status"] == "fail"
    assert "AMB_JUDGE_BASE_URL, AMB_JUDGE_API_KEY, AMB_JUDGE_MODEL" in checks["judge endpoint"]["detail"]
    env = {
        "AMB_JUDGE_BASE_URL": "http://127.0.0.1:9/v1",
        "AMB_JUDGE_API_KEY": "k",
        "AMB_JUDGE_MODEL": "judge-1",
    }
    code, checks = doctor(tmp_path, "--judge", "llm", PATH=tool_dir(tmp_path, without="nothing"), **env)
    assert checks["judge endpoint"]["status"] == "ok" and "judge-1" in checks["judge endpoint"]["detail"]


def test_text_output_says_what_to_do(tmp_path):
    env = os.environ | {"DOCKER_HOST": f"unix://{tmp_path}/none.sock", "AMB_STORE": str(tmp_path / "s")}
    proc = subprocess.run([AMB, "doctor"], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1
    line = next(li for li in proc.stdout.splitlines() if "docker engine" in li)
    assert line.startswith("FAIL")
    assert "-> start one" in proc.stdout and "1 check failed" in proc.stdout


def test_a_damaged_database_is_named_with_the_way_back(tmp_path):
    # A cut-short amb.duckdb fails every command; doctor says so, and so does each command, with the
    # way back, which must work: the file moved aside, `amb ingest` rebuilds it from the spools.
    from recorder.synthetic import generate_run
    from replay.ingest import ingest

    store = tmp_path / "store"
    for i in range(2):
        generate_run(store, f"run-{i}", seed=i, calls=4)
    ingest(store)
    runs = subprocess.run([AMB, "runs", "--json", "--store", str(store)], capture_output=True, text=True)
    code, checks = doctor(tmp_path, PATH=tool_dir(tmp_path, without="nothing"))
    assert checks["database"]["status"] == "ok" and "holds 2 runs" in checks["database"]["detail"]
    db = store / "amb.duckdb"
    os.truncate(db, 100_000)  # its header whole, the blocks it points at cut off
    code, checks = doctor(tmp_path, PATH=tool_dir(tmp_path, without="nothing"))
    assert code == 1 and {name for name, c in checks.items() if c["status"] == "fail"} == {"database"}
    assert checks["database"]["detail"].startswith(f"{db} is damaged (")
    assert checks["database"]["fix"].startswith("move it aside and run `amb ingest`, which rebuilds it")
    for command in (["runs"], ["show", "run-0"], ["verify"], ["ingest"], ["score", "--all"]):
        proc = subprocess.run([AMB, *command, "--store", str(store)], capture_output=True, text=True)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"amb: error: {db} is damaged (") and "run `amb ingest`" in proc.stderr
    db.rename(tmp_path / "damaged.duckdb")
    rebuilt = subprocess.run([AMB, "ingest", "--store", str(store)], capture_output=True, text=True)
    assert rebuilt.returncode == 0, rebuilt.stderr
    again = subprocess.run([AMB, "runs", "--json", "--store", str(store)], capture_output=True, text=True)
    assert again.stdout == runs.stdout and json.loads(again.stdout)
    verified = subprocess.run([AMB, "verify", "--store", str(store)], capture_output=True, text=True)
    assert verified.returncode == 0 and verified.stdout.startswith("OK ")
