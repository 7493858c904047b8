"""The VQA grader: one ``answer.json`` per question of the reference, read defensively and scored
by ``scorer.metrics.vqa``. What makes an answer ``missing``, ``invalid``, an honest skip or a warning
is in docs/vqa-and-report.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas.task_spec import TaskSpec
from schemas.untrusted_json import loads_untrusted
from scorer.grader.gate import gated_score
from scorer.grader.options import GradeOptions
from scorer.grader.result import CaseResult, GradeResult, invalid_case, missing_case
from scorer.grader.submitted import Rejected
from scorer.grader.textfile import UnreadableText, read_submitted_text, read_text
from scorer.metrics import vqa as m

MAX_ANSWER_BYTES = 1 << 20
"""An answer file larger than this is rejected unread (answers are a few hundred bytes)."""

REQUIRED_KEYS = (
    *("question_id", "predicted_label", "predicted_answer"),
    *("raw_model_output", "model_name", "runtime_s"),
)


class BadFile(Exception):
    """A submitted or reference JSON file that cannot be used; the message is the case's reason."""


def read_json_object(
    path: Path, limit: int = MAX_ANSWER_BYTES, submission: Path | None = None
) -> dict[str, Any]:
    """A JSON object from ``path``, or ``BadFile`` naming what is wrong (never hangs: size-capped,
    regular files only). With ``submission``, ``path`` is relative to it and is opened only if it is
    a regular file that lives there (``Rejected`` with kind ``missing`` when it is absent)."""
    try:
        if submission is None:
            text = read_text(path, limit)
        else:
            text = read_submitted_text(submission, str(path), limit)
    except UnreadableText as e:
        raise BadFile(f"{path.name}: {e}") from e
    try:
        obj = loads_untrusted(text)
    except ValueError as e:
        raise BadFile(f"{path.name}: bad JSON: {str(e)[:120]}") from e
    if not isinstance(obj, dict):
        raise BadFile(f"{path.name}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _text_field(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadFile(f"{key} must be a string, got {type(value).__name__}")
    return value


def grade_case(
    spec: TaskSpec, qid: str, gold: dict[str, Any], submission: Path, options: GradeOptions
) -> CaseResult:
    assert spec.vqa is not None
    rel = f"{spec.submission.root}/{qid}/{spec.vqa.answer_file}".removeprefix("./")
    try:
        record = read_json_object(Path(rel), submission=submission)
        answer = _text_field(record, "predicted_answer")
        raw = _text_field(record, "raw_model_output")
    except Rejected:
        return missing_case(qid, f"{rel}: no answer file")
    except BadFile as e:
        return invalid_case(qid, f"{rel}: {e}")
    warnings = []
    absent = [k for k in REQUIRED_KEYS if k not in record]
    if absent:
        warnings.append(f"missing keys {absent}")
    if "question_id" in record and str(record.get("question_id")) != qid:
        warnings.append(f"question_id {str(record.get('question_id'))[:40]!r} does not match the folder")
    placeholder = m.detect_placeholder(raw, answer)
    if placeholder:
        return invalid_case(qid, f"{rel}: placeholder answer ({placeholder})", placeholder=placeholder)
    details: dict[str, Any] = {"answer_type": gold.get("answer_type", "")}
    if spec.vqa.answer_mode == "multiple_choice":
        if "predicted_label" in record and not isinstance(record["predicted_label"], str):
            # The label is the answer. Read as text, a list or an object shows its letters ("['C']")
            # and would match; a number, a boolean or null names no choice.
            value = record["predicted_label"]
            got = "null" if value is None else type(value).__name__
            return invalid_case(qid, f"{rel}: predicted_label must be a string, got {got}")
        label = m.normalize_label(record.get("predicted_label"))
        if label is None and not answer.strip() and not raw.strip():
            return _scored(qid, 0.0, "honest skip: empty answer and raw output", details, warnings)
        if label is None:
            shown = str(record.get("predicted_label"))[:40]
            return invalid_case(qid, f"{rel}: predicted_label {shown!r} is not one of A-E")
        gold_label = str(gold.get("answer_label", ""))
        details.update(predicted_label=label, gold_label=gold_label)
        return _scored(qid, m.choice_score(label, gold_label), None, details, warnings)
    if not answer.strip():
        why = "honest skip: empty answer and raw output" if not raw.strip() else "empty predicted_answer"
        return _scored(qid, 0.0, why, details, warnings)
    golds = [str(gold.get("answer_text", ""))] + [
        str(a) for a in gold.get("alternatives", []) if isinstance(a, str)
    ]
    score = m.open_case_score(answer, golds, options.vqa_matching)
    details.update(predicted=m.normalize_answer(answer)[:200], gold=m.normalize_answer(golds[0]))
    if options.vqa_matching == "em_f1" and not m.is_yes_no(golds[0]):
        details.update(
            em=max(m.exact_match(answer, g) for g in golds), f1=max(m.token_f1(answer, g) for g in golds)
        )
    return _scored(qid, score, None, details, warnings)


def _scored(
    qid: str, score: float, reason: str | None, details: dict[str, Any], warnings: list[str]
) -> CaseResult:
    if warnings:
        reason = "; ".join(([reason] if reason else []) + [f"warning: {w}" for w in warnings])
    return CaseResult(case=qid, score=score, reason=reason, details=details)


def grade_track(spec: TaskSpec, submission: Path, reference: Path, options: GradeOptions) -> GradeResult:
    assert spec.vqa is not None, f"task {spec.id}: no [vqa] table"
    cases: list[CaseResult] = []
    for qid in sorted(p.parent.name for p in reference.glob(f"*/{spec.vqa.answer_file}")):
        try:
            gold = read_json_object(reference / qid / spec.vqa.answer_file)
        except BadFile as e:
            # A broken reference is not the agent's fault, but it must not be silent either.
            cases.append(invalid_case(qid, f"reference {qid}/{spec.vqa.answer_file}: {e}"))
            continue
        cases.append(grade_case(spec, qid, gold, submission, options))
    score, checks = gated_score(cases, options)
    checks["n_correct"] = sum(1 for c in cases if c.score >= 1.0)
    return GradeResult(
        task=spec.id,
        metric=spec.metric.name,
        score=score,
        cases=cases,
        params={
            **spec.metric.params,
            "vqa_matching": options.vqa_matching,
            "completeness": options.completeness,
        },
        checks=checks,
    )
