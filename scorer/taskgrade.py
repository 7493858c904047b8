"""TASK scores: the sealed submission, materialised from its blobs, graded by ``scorer.grader``.

The grader is a pure function of (task spec, submission files, references, grade options), so its
result is cached under the hash of exactly those inputs (``grade_key``): a rescore with unchanged
metric options never re-reads a mask. Anything that prevents grading gives an *unscored* TASK with
the reason, never 0. S4 and S5 are derived here too, as functions of the same grade (the paper's
Table 7, docs/scoring.md).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import msgspec

from schemas.codec import canonical_digest
from schemas.display import clip, one_line
from schemas.errors import AmbError
from schemas.ostext import NotOsText, os_bytes
from schemas.tempdirs import tempdir
from scorer.trajectory import BlobGetter, Trajectory

_ref_fingerprints: dict[str, str] = {}


def reference_dir(references: Path | None, task: str) -> Path | None:
    """``<references>/<task>/private``, or ``<references>/private`` for a single-task folder."""
    if references is None:
        return None
    return next((c for c in (references / task / "private", references / "private") if c.is_dir()), None)


def reference_fingerprint(ref: Path) -> str:
    """Digest of every reference file's path and content (computed once per process per folder)."""
    key = str(ref.resolve())
    if key not in _ref_fingerprints:
        h = hashlib.sha256()
        for p in sorted(ref.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(ref)).encode() + b"\0")
                with open(p, "rb") as f:
                    h.update(hashlib.file_digest(f, "sha256").digest())
        _ref_fingerprints[key] = "sha256:" + h.hexdigest()
    return _ref_fingerprints[key]


def grade_key(
    task: str, spec_json: bytes, files: list[tuple[str, str]], ref_fp: str, options: dict[str, Any]
) -> str:
    spec = hashlib.sha256(spec_json).hexdigest()
    return canonical_digest({"task": task, "spec": spec, "files": files, "ref": ref_fp, "options": options})


def _relative(path: str, root: str) -> str:
    """``path`` relative to ``root``: a sealed path is recorded relative to it, and one under it is
    taken as relative too. Any other absolute path stays absolute (and is refused by ``materialise``)."""
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1 :]
    return path


def _impossible(rel: bytes) -> str | None:
    """Why ``rel`` (a sealed name's bytes, relative to the root) names no file under a folder, or
    None. The sealer writes a file's path relative to the root, so none of these comes from it."""
    if rel.startswith(b"/"):
        return "an absolute path"
    if b"\0" in rel:
        return "a name holding a NUL byte"
    parts = rel.split(b"/")
    if b".." in parts:
        return "path escapes the submission root"
    if b"" in parts or b"." in parts:
        return "not a file's path (an empty or '.' part)"
    return None


def materialise(traj: Trajectory, get_blob: BlobGetter, into: Path) -> list[str]:
    """Write the sealed files under ``into``, each under the exact bytes of its name (paths are
    recorded text, ``schemas.ostext``); returns the paths that could not be written, each with why
    (content not stored, a name that is no file under ``into``, one the file system refuses)."""
    assert traj.submission is not None
    missing = []
    for f in traj.submission.files:
        shown = one_line(clip(f.path, 200))  # a name is the agent's: any length, any characters
        try:
            rel = os_bytes(_relative(f.path, traj.submission.root))
        except NotOsText:
            missing.append(f"{shown}: not the recorded text of a name")
            continue
        why = _impossible(rel)
        if why is not None:
            missing.append(f"{shown}: {why}")
            continue
        if f.content is None:
            missing.append(f"{shown}: content not stored (only its digest)")
            continue
        target = into / os.fsdecode(rel)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(get_blob(f.content))
        except OSError as e:  # a name over 255 bytes, a path over 4096, a file where a folder goes
            missing.append(f"{shown}: cannot be written ({e.strerror or e})")
    return missing


def summarise(result: Any) -> dict[str, Any]:
    """The grade facts the scorer keeps: counts, flags and the TASK score."""
    cases = result.cases
    n = len(cases)
    n_missing = sum(1 for c in cases if c.status == "missing")
    n_invalid = sum(1 for c in cases if c.status == "invalid")
    present = n - n_missing
    return {
        "metric": result.metric,
        "task_score": float(result.score),
        "n_cases": n,
        "n_missing": n_missing,
        "n_invalid": n_invalid,
        "completion": (present / n) if n else 0.0,
        "format_valid": bool(present > 0 and n_invalid == 0),
        "has_valid_results": any(c.status == "scored" and c.score > 0 for c in cases),
        "degraded": list(result.degraded),
        "problems": sorted({f"{c.case}: {c.reason}" for c in cases if c.reason})[:20],
        **{k: result.checks[k] for k in _CHECKS_KEPT if k in result.checks},
    }


_CHECKS_KEPT = ("medal_metric", "gate_zeroed", "mean_psnr_db", "mean_ssim_raw")
"""What the medal and rating rules read besides the counts (scorer.medal)."""


def unscored(reason: str) -> dict[str, Any]:
    return {"task_score": None, "reason": reason}


def grade_run(
    traj: Trajectory,
    get_blob: BlobGetter,
    *,
    references: Path | None,
    metrics: dict[str, Any],
    cache: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], str | None]:
    """(grade summary, cache key or None). The summary has ``task_score`` None when unscored."""
    if not traj.task:
        return unscored("run has no task id"), None
    try:
        from scorer.grader import grade
        from scorer.grader.options import options_from_table
        from tasks.registry import load_spec
    except ImportError as e:
        return unscored(f"grader not available: {e}"), None
    try:
        spec = load_spec(traj.task)
    except AmbError as e:
        return unscored(str(e)), None
    if traj.submission is None:
        # Nothing sealed: every case is missing. The grader says so on an empty folder when we
        # have references; without them the TASK stays unscored.
        files: list[tuple[str, str]] = []
    else:
        files = sorted((_relative(f.path, traj.submission.root), f.sha256) for f in traj.submission.files)
    ref = reference_dir(references, traj.task)
    if ref is None:
        return unscored(
            f"no references for task {traj.task} (give --references DIR with {traj.task}/private)"
        ), None
    key_options = dict(metrics)
    if metrics.get("enh_task_score") == "psnr_ssim_lpips" and spec.track == "enhancement":
        from scorer.metrics.lpips import weights_digest

        key_options["lpips_weights"] = weights_digest()  # the LPIPS network changes the number
    key = grade_key(traj.task, msgspec.json.encode(spec), files, reference_fingerprint(ref), key_options)
    if cache is not None and key in cache:
        return cache[key], key
    with tempdir("amb-sub-") as tmp:
        missing = [] if traj.submission is None else materialise(traj, get_blob, tmp)
        if missing:
            summary = unscored(
                "submission not gradable: " + "; ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
            )
        else:
            try:
                result = grade(spec, tmp, ref, options_from_table(metrics))
            except AmbError as e:
                return unscored(f"grader: {e}"), None
            summary = summarise(result)
    if cache is not None:
        cache[key] = summary
    return summary, key


def s4_s5(grade: dict[str, Any], rules: Any) -> tuple[float | None, float | None, str | None]:
    """S4 and S5 from a grade summary (None with the reason when the grade is unscored)."""
    if grade.get("task_score") is None or "completion" not in grade:
        return None, None, f"no grade: {grade.get('reason', 'unscored')}"
    fmt = 1.0 if grade["format_valid"] else 0.0
    s4 = rules.s4_completion_weight * grade["completion"] + rules.s4_format_weight * fmt
    s5 = (
        rules.s5_has_valid_weight * (1.0 if grade["has_valid_results"] else 0.0)
        + rules.s5_format_weight * fmt
    )
    return s4, s5, None
