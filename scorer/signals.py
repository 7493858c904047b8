"""Objective signals in a trajectory, shared by the offline judge and the error-code detectors.

Each function is a small, documented heuristic over facts (executed code, exit codes, outputs,
written files) and returns the event ids it rests on. They are deliberately conservative: a signal
that cannot be established from the record is absent, not guessed.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from schemas.task_spec import TaskSpec
from scorer.trajectory import Exec, Trajectory

SETUP_RE = re.compile(
    r"\b(pip3?\s+install|python3?\s+-m\s+(pip|venv)|uv\s+(pip|venv|sync)|conda\s+(install|create)|virtualenv|apt(-get)?\s+install)\b"
)
SETUP_FAIL_RE = re.compile(
    r"(ModuleNotFoundError|ImportError|No matching distribution|Could not find a version|"
    r"ERROR: (pip|Could not)|CUDA (error|out of memory)|OutOfMemoryError|HTTPError|404 Client Error|"
    r"ConnectionError|RepositoryNotFoundError|EntryNotFoundError|FileNotFoundError: "
    r".*\.(pt|pth|ckpt|safetensors|bin|onnx)|"
    r"Error\(s\) in loading state_dict|unexpected key|size mismatch for)"
)
TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception): ", re.M)
WEIGHTS_RE = re.compile(
    r"(from_pretrained|hf_hub_download|snapshot_download|torch\.load|load_state_dict|torch\.hub\.load|"
    r"\.(pth|pt|ckpt|safetensors|onnx)\b|model_final|nnUNet_results|wget\s+\S+|curl\s+-\S*[oO])"
)
WEIGHT_FILE_RE = re.compile(r"\.(pth|pt|ckpt|safetensors|onnx|bin|h5)$|model_final")
INPUT_LOAD_RE = re.compile(
    r"(nib\.load|nibabel|sitk\.ReadImage|np\.load|Image\.open|imread|json\.load|pydicom|open\()"
)
INPUT_CHECK_RE = re.compile(
    r"(\.shape|get_zooms|GetSpacing|spacing|\.dtype|\.header|np\.(min|max|unique)|\.min\(\)|\.max\(\)|\bsize\b)"
)
OUTPUT_CHECK_RE = re.compile(
    r"(\.shape|np\.unique|unique\(|\.sum\(\)|\.min\(\)|\.max\(\)|isnan|isfinite|allclose|assert "
    r"|len\(|\.dtype|json\.load)"
)
GPU_RE = re.compile(
    r"(\.cuda\(|to\(['\"]cuda|device\s*=\s*['\"]?cuda|torch\.device\(['\"]cuda|cuda:0|device_map|CUDAExecutionProvider|\bgpu\b)",
    re.I,
)
FORWARD_RE = re.compile(
    r"(\.generate\(|predict|infer|inference|forward\(|model\(|run_case|sliding_window|\.run\(|pipeline\()"
)
HUB_HOSTS = (
    *("huggingface.co", "hf.co", "zenodo.org", "github.com", "objects.githubusercontent.com"),
    *("download.pytorch.org", "ngc.nvidia.com"),
)


class Outputs(NamedTuple):
    """Where a task's per-case outputs live, from its spec's submission contract.

    Built from ``[submission] root`` and ``files`` (``{case}`` marks the case id), so a task whose
    outputs sit directly in the workspace (VQA: ``<qid>/answer.json``, root ``.``) is recognised
    as well as ``agents_outputs/<case>/...``. For an unknown task: the benchmark's usual folders.
    """

    roots: tuple[str, ...]
    names: tuple[str, ...]
    """Output file names (``answer.json``): how code that handles outputs is recognised."""
    patterns: tuple[re.Pattern[str], ...]
    workspace: str | None = None

    def _relative(self, path: str) -> str:
        path = path.replace("\\", "/")
        if self.workspace and path.startswith(self.workspace.rstrip("/") + "/"):
            path = path[len(self.workspace.rstrip("/")) + 1 :]
        while path.startswith("./"):
            path = path[2:]
        return path

    def case_of(self, path: str) -> str | None:
        """The case id of a submission output path, None for other files."""
        rel = self._relative(path)
        return next((m.group("case") for pattern in self.patterns if (m := pattern.match(rel))), None)

    def is_output(self, path: str) -> bool:
        return self.case_of(path) is not None

    def mentioned_in(self, code: str) -> bool:
        return any(r in code for r in self.roots if r != ".") or any(n in code for n in self.names)


_FALLBACK_ROOTS = ("agents_outputs", "agent_outputs")


@lru_cache(maxsize=256)
def task_spec(task: str | None) -> TaskSpec | None:
    """The spec of a task id; None when the task is unknown or broken (its run is still scored, with
    TASK unscored and the benchmark's usual layout)."""
    if not task:
        return None
    try:
        from tasks.registry import load_spec

        return load_spec(task)
    except Exception:
        return None


def output_root(traj: Trajectory) -> Outputs:
    spec = task_spec(traj.task)
    if spec is None:
        pattern = re.compile(r"^(?:agents_outputs|agent_outputs)/(?P<case>[^/]+)/.+$")
        return Outputs(_FALLBACK_ROOTS, (), (pattern,), traj.workspace)
    root = spec.submission.root.strip("/") or "."
    prefix = "" if root == "." else re.escape(root) + "/"
    patterns, names = [], []
    for f in list(spec.submission.files) + list(spec.submission.optional):
        if "{case}" not in f:
            continue
        body = (
            re.escape(f)
            .replace(re.escape("{case}"), "(?P<case>[^/]+)", 1)
            .replace(re.escape("{case}"), "(?P=case)")
        )
        patterns.append(re.compile(f"^{prefix}{body}$"))
        names.append(f.rsplit("/", 1)[-1])
    return Outputs(
        tuple(dict.fromkeys((root,) + _FALLBACK_ROOTS)),
        tuple(dict.fromkeys(names)),
        tuple(patterns),
        traj.workspace,
    )


def exec_cases(ex: Exec, roots: Outputs) -> set[str]:
    return {c for c in (roots.case_of(p) for p in ex.files) if c}


def setup_failures(traj: Trajectory) -> list[Exec]:
    """Executions that failed on installing or loading something (packages, checkpoints, GPU)."""
    return [
        ex
        for ex in traj.execs
        if ex.ok is False and (SETUP_RE.search(ex.code) or SETUP_FAIL_RE.search(ex.stderr or ex.output))
    ]


def traceback_execs(traj: Trajectory) -> list[Exec]:
    return [ex for ex in traj.execs if ex.ok is False and TRACEBACK_RE.search(ex.stderr or ex.output)]


def bulk_index(traj: Trajectory, roots: Outputs) -> int | None:
    """Index of the first execution that wrote outputs for two or more cases (bulk inference)."""
    return next((i for i, ex in enumerate(traj.execs) if len(exec_cases(ex, roots)) >= 2), None)


def pilot_evidence(traj: Trajectory, roots: Outputs) -> tuple[float, str, list[str]]:
    """The S3 signal: (1, 0.5 or 0, reason, event ids).

    1: before the first bulk execution a successful execution wrote exactly one case's outputs and a
    later pre-bulk successful execution (or the same one) inspected them (shape/values). 0.5: a
    one-case pilot without an inspection, or an inspection that only happened after the batch.
    0: neither.
    """
    bulk = bulk_index(traj, roots)
    end = bulk if bulk is not None else len(traj.execs)
    pilots = [ex for ex in traj.execs[:end] if ex.ok and len(exec_cases(ex, roots)) == 1]
    if pilots:
        pilot = pilots[0]
        start = traj.execs.index(pilot)
        for ex in traj.execs[start:end]:
            if ex.ok and OUTPUT_CHECK_RE.search(ex.code) and (ex is pilot or roots.mentioned_in(ex.code)):
                why = "one-case pilot, then its output inspected before bulk inference"
                return 1.0, why, [pilot.id, ex.id]
        return 0.5, "one-case pilot before bulk inference, but its output was not inspected", [pilot.id]
    if bulk is not None:
        later = [
            ex
            for ex in traj.execs[bulk + 1 :]
            if ex.ok and OUTPUT_CHECK_RE.search(ex.code) and roots.mentioned_in(ex.code)
        ]
        if later:
            return 0.5, "outputs inspected only after bulk inference", [traj.execs[bulk].id, later[0].id]
        return 0.0, "bulk inference without a pilot or any output check", [traj.execs[bulk].id]
    return 0.0, "no pilot run found", []
