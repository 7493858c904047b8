"""``amb sweep --executor k8s --emit DIR``: Kubernetes Indexed Job manifests for a sweep (not run).

One Job per resource class, ``completionMode: Indexed``: pod *i* runs ``amb sweep exec`` on the
*i*-th run spec of its class, under the shim (local backend: no Docker engine in a pod), and its
shard lands on a ReadWriteMany volume mounted at the sweep's work path. A retried pod whose attempt
already has its shard exits 0 (the exec's exit 3 is turned into success). The manifests are
validated offline (``kubernetes-validate --strict``), not run against a live cluster.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from sweeps.driver import limits_for, plan_cells, prepare_data, write_specs
from sweeps.executor import K8sOptions
from sweeps.plan import SweepSpec
from sweeps.shard import Layout
from sweeps.spec import CellLimits

GRACE_S = 30
"""Pod termination grace: the exec forwards SIGTERM to the agent and closes the run in well under it."""


def dns_label(text: str, limit: int = 52) -> str:
    """A DNS-1123 label (lowercase letters, digits, '-'), short enough for a Job's generated pod names."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (out[:limit].rstrip("-")) or "amb"


def _quantity_memory(memory: str) -> str:
    """Docker's ``8g`` / ``512m`` as a Kubernetes quantity (``8Gi`` / ``512Mi``)."""
    m = re.fullmatch(r"(\d+)([kmgt]?)b?", memory.strip().lower())
    if not m:
        return memory
    unit = {"": "", "k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti"}[m.group(2)]
    return m.group(1) + unit


def job_manifest(
    name: str, spec: SweepSpec, opts: K8sOptions, limits: CellLimits, run_ids: list[str]
) -> dict[str, Any]:
    root = str(spec.work)
    # POSIX sh: the index picks one run id from the positional parameters (ids are [A-Za-z0-9._:-]).
    script = (
        f'set -- {" ".join(run_ids)}; shift "$JOB_COMPLETION_INDEX"; '
        f'amb sweep exec "{root}/specs/$1.json"; rc=$?; [ "$rc" -eq 3 ] && exit 0; exit "$rc"'
    )
    resources: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    env = [{"name": "AMB_AGENT_IMAGE", "value": opts.agent_image}]
    if limits.cpus:
        resources["requests"]["cpu"] = resources["limits"]["cpu"] = f"{limits.cpus:g}"
        env.append({"name": "AMB_CPUS", "value": f"{limits.cpus:g}"})
    if limits.memory:
        resources["requests"]["memory"] = resources["limits"]["memory"] = _quantity_memory(limits.memory)
        env.append({"name": "AMB_MEMORY", "value": limits.memory})
    if limits.gpus:
        resources["limits"]["nvidia.com/gpu"] = str(limits.gpus)
    container: dict[str, Any] = {
        "name": "run",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", script],
        "env": env,
        "volumeMounts": [{"name": "sweep", "mountPath": root}],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if resources["requests"] or resources["limits"]:
        container["resources"] = {k: v for k, v in resources.items() if v}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": opts.namespace,
            "labels": {"app.kubernetes.io/name": "amb-sweep", "amb.sweep": dns_label(spec.name, 63)},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": len(run_ids),
            "parallelism": min(len(run_ids), opts.parallelism or spec.concurrency),
            "backoffLimitPerIndex": 1,
            "maxFailedIndexes": len(run_ids),
            "podFailurePolicy": {
                "rules": [
                    # Evicted or preempted pods (node drained, spot reclaimed) are retried without
                    # counting against the index's backoff limit.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
                ]
            },
            "activeDeadlineSeconds": int(limits.time_limit_s * len(run_ids) + 3600),
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "amb-sweep"}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": GRACE_S,
                    "containers": [container],
                    "volumes": [{"name": "sweep", "persistentVolumeClaim": {"claimName": opts.volume_claim}}],
                },
            },
        },
    }


def emit(spec: SweepSpec, out_dir: Path) -> list[Path]:
    """Write every pending cell's run spec (local backend) under the sweep's work path and one Job
    manifest per resource class into ``out_dir``; returns the manifests' paths."""
    layout = Layout(spec.work)
    layout.make()
    prepare_data(spec, lambda _text: None)
    opts = spec.executor.k8s
    classes: dict[CellLimits, list[str]] = {}
    for run_id, cell, _path in write_specs(spec, plan_cells(spec, layout), layout, "local"):
        classes.setdefault(limits_for(spec, cell), []).append(run_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i, (limits, run_ids) in enumerate(sorted(classes.items(), key=lambda kv: kv[1][0])):
        name = f"{dns_label(spec.name, 40)}-{i}"
        path = out_dir / f"{name}.json"
        path.write_bytes(
            msgspec.json.format(
                msgspec.json.encode(job_manifest(name, spec, opts, limits, run_ids)), indent=2
            )
        )
        written.append(path)
    return written
