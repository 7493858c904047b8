"""The report-generation grader: one ``report.txt`` per reference study, read defensively, checked
against the task's validity rules (a broken rule makes the case ``invalid``, named in the reason),
and the valid cases scored together by ``scorer.metrics.text.report_score`` on the scored section.

At ``corpus`` level the corpus metrics cover the valid cases only and go through the same gate as
the per-case mean, with the corpus value in its place: so a missing case still costs its share
(``per_case_zero`` multiplies by the valid fraction, as a 0 in a mean would).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from schemas.task_spec import TaskSpec
from scorer.grader.gate import gated_score
from scorer.grader.options import GradeOptions
from scorer.grader.result import CaseResult, GradeResult, invalid_case, missing_case
from scorer.grader.submitted import Rejected
from scorer.grader.textfile import UnreadableText, read_submitted_text
from scorer.metrics import text as t
from tasks.report_text import rules_of


class BadReport(Exception):
    """A report file that cannot be scored; the message is the case's reason."""


def read_report(submission: Path, rel: str, rules: t.Validity) -> str:
    """The text of the submitted report ``submission/rel``, or ``BadReport`` naming the rule it
    breaks (``Rejected`` with kind ``missing`` when there is none)."""
    limit = 4 * rules.max_chars + 4  # UTF-8 is at most 4 bytes a character
    too_long = f"too long (more than {limit} bytes, limit {rules.max_chars} chars)"
    try:
        text = read_submitted_text(submission, rel, limit, too_long)
    except UnreadableText as e:
        raise BadReport(str(e)) from e
    errors = t.validity_errors(text, rules)
    if errors:
        raise BadReport("; ".join(errors))
    return text


def _reference_text(path: Path) -> str:
    """A reference report: read leniently (no validity rules; the references are ours)."""
    if not path.is_file():
        raise BadReport("reference is not a regular file")
    try:
        return path.read_bytes()[: 1 << 20].decode("utf-8", errors="replace")
    except OSError as e:
        raise BadReport(f"cannot read the reference: {e.strerror or e}") from e


def grade_track(spec: TaskSpec, submission: Path, reference: Path, options: GradeOptions) -> GradeResult:
    assert spec.report is not None, f"task {spec.id}: no [report] table"
    out_file = spec.report.output_file
    rules = rules_of(spec.report)
    case_ids = sorted(p.parent.name for p in reference.glob(f"*/{out_file}"))

    results: dict[str, CaseResult] = {}
    scored_ids: list[str] = []
    hyps: list[str] = []
    refs: list[str] = []
    for case in case_ids:
        rel = f"{spec.submission.root}/{case}/{out_file}"
        try:
            ref_text = _reference_text(reference / case / out_file)
        except BadReport as e:
            results[case] = invalid_case(case, f"reference {case}/{out_file}: {e}")
            continue
        try:
            text = read_report(submission, rel, rules)
        except Rejected:
            results[case] = missing_case(case, f"{rel}: no report")
            continue
        except BadReport as e:
            results[case] = invalid_case(case, f"{rel}: {e}")
            continue
        scored_ids.append(case)
        hyps.append(t.scored_text(text, spec.report.section))
        refs.append(t.scored_text(ref_text, spec.report.section))

    rs = t.report_score(hyps, refs, level=options.text_level) if scored_ids else None
    if rs is not None:
        for case, parts in zip(scored_ids, rs.cases, strict=False):
            details = {k: round(v, 6) for k, v in parts.items() if k != "score"}
            results[case] = CaseResult(case=case, score=parts["score"], details=details)
    cases = [results[c] for c in case_ids]

    if options.text_level == "corpus" and rs is not None:
        corpus = rs.score
        score, checks = gated_score(cases, options, aggregate=lambda cs: _corpus_aggregate(cs, corpus))
    else:
        score, checks = gated_score(cases, options)
    params = {**spec.metric.params, "text_level": options.text_level, "completeness": options.completeness}
    if rs is not None:
        params["backends"] = rs.backends
        checks["components"] = {k: round(v, 6) for k, v in rs.components.items()}
        checks["bleu_n_corpus"] = {k: round(v, 6) for k, v in rs.extras.items()}
    return GradeResult(
        task=spec.id,
        metric=spec.metric.name,
        score=score,
        cases=cases,
        degraded=list(rs.degraded) if rs is not None else [],
        params=params,
        checks=checks,
    )


def _corpus_aggregate(cases: Sequence[CaseResult], corpus: float) -> float:
    """The corpus score stands for the scored cases; unscored cases in ``cases`` count as 0."""
    if not cases:
        return 0.0
    n_scored = sum(1 for c in cases if c.status == "scored")
    return corpus * n_scored / len(cases)
