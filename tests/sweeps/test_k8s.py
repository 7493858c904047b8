"""``amb sweep --executor k8s --emit DIR``: Indexed Job manifests, validated offline against the
schemas of a current Kubernetes with ``kubernetes-validate --strict`` (no cluster can run here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
from click.testing import CliRunner

from amb.main import cli
from sweeps.spec import RunSpec

BIN = Path(sys.executable).parent
KUBERNETES = "1.37.0"
SWEEP = """
name = "Nightly_K8s"
tasks = ["bccd-det", "vqa-rad"]
tiers = ["lite", "standard"]
repeats = 2
concurrency = 3
time_limit_s = 600
cases = 1
cpus = 2
memory = "4g"

[[agents]]
name = "baseline"
command = ["amb-agent", "--model", "{model}", "--task-dir", "{workspace}", "--data", "{data}"]
model = "baseline"
upstream = "openai={baseline}"

[[resources]]
task = "vqa-rad"
tier = "standard"
gpus = 1
memory = "16g"

[executor]
name = "k8s"
[executor.k8s]
image = "registry.example/amb-recorder:0.1"
namespace = "bench"
volume_claim = "amb-shared"
"""


def test_manifests_are_indexed_jobs_that_pass_strict_validation(tmp_path):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    work, out = tmp_path / "work", tmp_path / "manifests"
    result = CliRunner().invoke(
        cli,
        ["sweep", "--work", str(work), "--executor", "k8s", "--emit", str(out), str(tmp_path / "sweep.toml")],
    )
    assert result.exit_code == 0, result.output
    files = sorted(out.glob("*.json"))
    assert [f.name for f in files] == ["nightly-k8s-0.json", "nightly-k8s-1.json"]  # two resource classes

    proc = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES, *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("passed for resource job/") == len(files), proc.stdout

    jobs = [json.loads(f.read_text()) for f in files]
    indexes = {}
    for job in jobs:
        spec = job["spec"]
        assert spec["completionMode"] == "Indexed" and job["metadata"]["namespace"] == "bench"
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == "registry.example/amb-recorder:0.1"
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "amb-shared"
        assert container["volumeMounts"][0]["mountPath"] == str(work.resolve())
        script = container["command"][2]
        run_ids = script.split("set -- ", 1)[1].split(";", 1)[0].split()
        assert spec["completions"] == len(run_ids) and spec["parallelism"] == min(3, len(run_ids))
        gpus = container["resources"]["limits"].get("nvidia.com/gpu")
        for rid in run_ids:
            indexes[rid] = gpus
    # every cell once; the GPU class holds exactly the vqa-rad standard cells, with their memory
    cells = [
        f"nightly_k8s-baseline-{t}-{tier}-r{k}"
        for t in ("bccd-det", "vqa-rad")
        for tier in ("lite", "standard")
        for k in (1, 2)
    ]
    assert sorted(indexes) == sorted(c.replace("nightly_k8s", "Nightly_K8s") for c in cells)
    assert {r for r, g in indexes.items() if g == "1"} == {
        f"Nightly_K8s-baseline-vqa-rad-standard-r{k}" for k in (1, 2)
    }
    gpu_job = next(
        j
        for j in jobs
        if "nvidia.com/gpu" in j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    )
    assert gpu_job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "16Gi"
    # the specs the pods execute are there, on the shared path, for the pod's local backend
    for rid in indexes:
        spec = msgspec.json.decode((work / "specs" / f"{rid}.json").read_bytes(), type=RunSpec)
        assert spec.backend == "local" and spec.shard_root == str(work.resolve())


def test_a_broken_manifest_fails_strict_validation(tmp_path):
    # The validator is strict for real: one unknown field in the pod spec makes it fail.
    (tmp_path / "sweep.toml").write_text(SWEEP)
    out = tmp_path / "m"
    result = CliRunner().invoke(
        cli,
        [
            "sweep",
            "--work",
            str(tmp_path / "w"),
            "--executor",
            "k8s",
            "--emit",
            str(out),
            str(tmp_path / "sweep.toml"),
        ],
    )
    assert result.exit_code == 0, result.output
    path = sorted(out.glob("*.json"))[0]
    job = json.loads(path.read_text())
    job["spec"]["template"]["spec"]["containers"][0]["cpuz"] = "2"
    path.write_text(json.dumps(job))
    proc = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "cpuz" in proc.stdout + proc.stderr
