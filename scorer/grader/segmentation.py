"""The segmentation grader: macro Dice with AutoMedBench's conventions (``scorer.metrics.dice``).

``binary`` tasks have one mask per target (organ, lesion), binarised with ``> threshold``;
``multiclass`` tasks one integer label map. How cases and labels are averaged is in
docs/tasks-and-grader.md. Both empty → 1.0, exactly one empty → 0.0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from schemas.task_spec import SegSpec, SegTarget, TaskSpec
from scorer.grader.gate import gated_score
from scorer.grader.options import GradeOptions
from scorer.grader.result import BadReference, CaseResult, GradeResult, invalid_case, missing_case
from scorer.grader.submitted import Rejected, open_submitted
from scorer.grader.volume_io import VolumeError, read_volume
from scorer.metrics.dice import binary_counts, binary_dice, confusion, dice_per_label, label_histogram

WEIGHTS = {
    "organ_lesion_50_50": {"organ": 0.5, "lesion": 0.5},
    "organ_lesion_25_75": {"organ": 0.25, "lesion": 0.75},
}


def grade_track(spec: TaskSpec, submission: Path, reference: Path, options: GradeOptions) -> GradeResult:
    seg = spec.seg
    assert seg is not None  # decode_spec guarantees it for this track
    cases = reference_cases(reference)
    root_name = spec.submission.root
    params: dict[str, Any] = {
        **spec.metric.params,
        "mode": seg.mode,
        "threshold": seg.threshold,
        "completeness": options.completeness,
    }
    aggregate: Callable[[Sequence[CaseResult]], float]
    if seg.mode == "binary":
        results = [_binary_case(seg, c, submission, reference / c, options, root_name) for c in cases]
        aggregate = partial(_binary_aggregate, seg, options.seg_formula)
        params.update(seg_formula=options.seg_formula, seg_invalid_case=options.seg_invalid_case)
        if options.seg_formula in WEIGHTS:
            params["weights"] = WEIGHTS[options.seg_formula]
    else:
        results = [_multiclass_case(seg, c, submission, reference / c, options, root_name) for c in cases]
        aggregate = _multiclass_aggregate
        params.update(
            labels=[lab.id for lab in seg.labels], seg_multiclass_empty=options.seg_multiclass_empty
        )
    score, checks = gated_score(results, options, aggregate)
    if seg.mode == "binary":
        lesions = [t.name for t in seg.targets if t.kind == "lesion"]
        checks["lesion_positive_cases"] = sum(
            1 for r in results if any(r.details["ref_positive"].get(n) for n in lesions)
        )
        checks["dropped"] = sum(1 for r in results if r.details.get("dropped"))
        # The medal's input in eval_seg run_eval: the mean lesion Dice over lesion-positive cases,
        # before the completeness gate.
        used = [r for r in results if not r.details.get("dropped")]
        values = [r.details["dice"][n] for r in used for n in lesions if n in r.details["counted"]]
        checks["medal_metric"] = float(np.mean(values)) if values else 0.0
    else:
        checks["medal_metric"] = _multiclass_aggregate(results)
    return GradeResult(
        task=spec.id, metric=spec.metric.name, score=score, cases=results, params=params, checks=checks
    )


def reference_cases(reference: Path) -> list[str]:
    cases = sorted(p.name for p in reference.iterdir() if p.is_dir())
    if not cases:
        raise BadReference(f"reference {reference}: no case folders")
    return cases


def _read_reference(path: Path) -> np.ndarray:
    try:
        return read_volume(path, None)
    except VolumeError as e:
        raise BadReference(f"reference {path}: {e}") from e


def _open_target(submission: Path, case_rel: str, target: SegTarget) -> tuple[str, BinaryIO]:
    """(name, open file) of a target's submitted volume: its own name first, then the accepted
    aliases. ``Rejected`` (missing, or the first name present that the grader refuses) otherwise."""
    refused: Rejected | None = None
    for name in (target.file, *target.alias):
        try:
            return name, open_submitted(submission, f"{case_rel}/{name}")
        except Rejected as e:
            if e.kind != "missing" and refused is None:
                refused = Rejected(f"{name}: {e}")
    if refused is not None:
        raise refused
    raise Rejected(f"{target.file}: missing", "missing")


# --- binary organ + lesion --------------------------------------------------------------------------


def _counted(seg: SegSpec, formula: str, ref_positive: dict[str, bool]) -> list[str]:
    """The targets a case contributes to: lesion targets only when the reference has a lesion,
    except under the paper's per-case macro where every target counts (both empty → 1)."""
    if formula == "per_case_macro":
        return [t.name for t in seg.targets]
    return [t.name for t in seg.targets if t.kind != "lesion" or ref_positive[t.name]]


def _case_score(seg: SegSpec, formula: str, dice: dict[str, float], counted: list[str]) -> float:
    """The formula restricted to one case (weights renormalised over the counted targets)."""
    if not counted:
        return 1.0
    if formula == "per_case_macro":
        return float(np.mean([dice[n] for n in counted]))
    kinds = {t.name: t.kind for t in seg.targets}
    w = {n: WEIGHTS[formula][kinds[n]] for n in counted}
    return float(sum(w[n] * dice[n] for n in counted) / sum(w.values()))


def _binary_case(
    seg: SegSpec, case: str, submission: Path, case_ref: Path, options: GradeOptions, root_name: str
) -> CaseResult:
    formula = options.seg_formula
    refs = [_read_reference(case_ref / t.file) for t in seg.targets]
    shape = refs[0].shape
    for t, r in zip(seg.targets, refs, strict=False):
        if r.shape != shape:
            raise BadReference(f"reference {case_ref / t.file}: shape differs from {seg.targets[0].file}")
    ref_positive = {t.name: bool((r > seg.threshold).any()) for t, r in zip(seg.targets, refs, strict=False)}
    counted = _counted(seg, formula, ref_positive)
    zero = {"dice": {t.name: 0.0 for t in seg.targets}, "counted": counted, "ref_positive": ref_positive}

    preds: list[np.ndarray | None] = []
    warnings = []
    wrong_shape: list[str] = []
    for t in seg.targets:
        try:
            name, f = _open_target(submission, f"{root_name}/{case}", t)
        except Rejected as e:
            make = missing_case if e.kind == "missing" else invalid_case
            return make(case, f"{root_name}/{case}/{e}", **zero)
        try:
            with f:
                data = read_volume(f, shape, name)
        except VolumeError as e:
            if e.kind == "shape" and options.seg_invalid_case == "organ_zero_lesion_drop":
                wrong_shape.append(f"{root_name}/{case}/{e}")
                preds.append(None)
                continue
            drop = e.kind == "shape" and options.seg_invalid_case == "drop"
            return invalid_case(case, f"{root_name}/{case}/{e}", **zero, dropped=drop)
        lo, hi = float(data.min(initial=0)), float(data.max(initial=0))
        if lo < 0 or hi > 1:
            warnings.append(
                f"{name}: values outside [0, 1] ({lo:g}..{hi:g}) binarised with > {seg.threshold:g}"
            )
        preds.append(data)

    good = [(p, r) for p, r in zip(preds, refs, strict=True) if p is not None]
    matrices = iter(binary_counts(good, seg.threshold) if good else [])
    dice: dict[str, float] = {}
    counts: dict[str, dict[str, int]] = {}
    for t, p in zip(seg.targets, preds, strict=True):
        if p is None:
            # eval_seg: a wrong-shaped mask scores Dice 0; an organ keeps that 0 in the organ mean, a
            # lesion leaves the lesion mean (its error makes gt_has_lesion false).
            dice[t.name] = 0.0
            if t.kind == "lesion":
                counted = [n for n in counted if n != t.name]
            continue
        m = next(matrices)
        dice[t.name] = binary_dice(m)
        counts[t.name] = {"tp": int(m[1, 1]), "fp": int(m[1, 0]), "fn": int(m[0, 1])}
    details: dict[str, Any] = {
        "dice": dice,
        "counted": counted,
        "ref_positive": ref_positive,
        "counts": counts,
    }
    if warnings:
        details["warnings"] = warnings
    if wrong_shape:
        return invalid_case(case, "; ".join(wrong_shape), **details)
    return CaseResult(case=case, score=_case_score(seg, formula, dice, counted), details=details)


def _binary_aggregate(seg: SegSpec, formula: str, cases: Sequence[CaseResult]) -> float:
    used = [c for c in cases if not c.details.get("dropped")]
    if not used:
        return 0.0
    if formula == "per_case_macro":
        return float(np.mean([c.score for c in used]))
    # Dataset-level mean per target over the cases it counts in, then the formula's weights.
    total = weight = 0.0
    for t in seg.targets:
        values = [c.details["dice"][t.name] for c in used if t.name in c.details["counted"]]
        if values:  # no lesion-positive case at all: the lesion term drops out, weights renormalise
            w = WEIGHTS[formula][t.kind]
            total += w * float(np.mean(values))
            weight += w
    return total / weight if weight else 0.0


# --- multiclass label map ----------------------------------------------------------------------------


def _as_labels(data: np.ndarray) -> np.ndarray:
    return np.rint(data) if data.dtype.kind == "f" else data


def _multiclass_case(
    seg: SegSpec, case: str, submission: Path, case_ref: Path, options: GradeOptions, root_name: str
) -> CaseResult:
    ids = [lab.id for lab in seg.labels]
    ref = _as_labels(_read_reference(case_ref / seg.label_file))
    if ref.size and ref.min() < 0:
        raise BadReference(f"reference {case_ref / seg.label_file}: negative label")
    n_ref = int(ref.max(initial=0)) + 1
    skip_empty = options.seg_multiclass_empty == "skip_gt_empty"

    def counted_from(ref_counts: np.ndarray) -> list[int]:
        # Which labels this case contributes to: all of them, or those present in the reference.
        if not skip_empty:
            return list(ids)
        return [i for i in ids if i < len(ref_counts) and ref_counts[i] > 0]

    def failed(make, reason: str) -> CaseResult:
        # Only an unscored case under skip_gt_empty needs a separate pass over the reference.
        counted = counted_from(label_histogram(ref, n_ref)) if skip_empty else list(ids)
        return make(case, reason, dice={str(i): 0.0 for i in counted}, counted=[str(i) for i in counted])

    name = seg.label_file
    try:
        f = open_submitted(submission, f"{root_name}/{case}/{name}")
    except Rejected as e:
        reason = f"{root_name}/{case}/{name}: {e}"
        return failed(missing_case if e.kind == "missing" else invalid_case, reason)
    try:
        with f:
            pred = _as_labels(read_volume(f, ref.shape, name))
    except VolumeError as e:
        return failed(invalid_case, f"{root_name}/{case}/{e}")
    allowed = {0, *ids}
    lo, hi = int(pred.min(initial=0)), int(pred.max(initial=0))
    if lo < 0 or hi > max(allowed):
        bad = lo if lo < 0 else hi
        return failed(invalid_case, f"{root_name}/{case}/{name}: label {bad} is not allowed")
    m = confusion(pred, ref, hi + 1, n_ref)
    present = np.nonzero(m.sum(axis=1))[0]
    disallowed = [int(v) for v in present if int(v) not in allowed]
    if disallowed:
        shown = ", ".join(str(v) for v in disallowed[:5])
        return failed(invalid_case, f"{root_name}/{case}/{name}: labels not allowed: {shown}")
    counted = counted_from(m.sum(axis=0))
    per_label = dice_per_label(m, counted)
    dice = {str(i): per_label[i] for i in counted}
    score = float(np.mean(list(dice.values()))) if dice else 1.0
    return CaseResult(case=case, score=score, details={"dice": dice, "counted": [str(i) for i in counted]})


def _multiclass_aggregate(cases: Sequence[CaseResult]) -> float:
    """Each label averaged over the cases it counts in, then the macro mean over labels."""
    per_label: dict[str, list[float]] = {}
    for c in cases:
        for lab in c.details.get("counted", []):
            per_label.setdefault(lab, []).append(c.details["dice"][lab])
    if not per_label:
        return float(np.mean([c.score for c in cases])) if cases else 0.0
    return float(np.mean([np.mean(v) for v in per_label.values()]))
