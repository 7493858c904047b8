"""The report grader on real synthetic twins: validity rules, FINDINGS extraction, case vs corpus
level, the completeness gate, degraded reporting, and a property test with malformed reports."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scorer.grader import grade
from scorer.grader.options import GradeOptions
from scorer.metrics import text
from tasks import synth
from tasks.registry import load_spec
from tests.scorer.helpers import fresh_dir, place


@pytest.fixture(scope="module")
def mimic(make_twin) -> Path:
    return make_twin("mimic-cxr-report", 4, 5)


PATHCAP = ("pathology-caption-100", 3, 5)
"""make_twin's arguments for the pathology caption twin."""


def _cases(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "private").iterdir() if p.is_dir())


def _ref(root: Path, case: str) -> str:
    return (root / "private" / case / "report.txt").read_text()


def _write(ws: Path, case: str, content: str | bytes | None) -> None:
    place(ws / "agent_outputs" / case / "report.txt", content)


def test_perfect_submission_both_levels(mimic, tmp_path):
    spec = load_spec("mimic-cxr-report")
    ws = tmp_path / "ws"
    synth.perfect_submission(spec, mimic, ws)
    for level in ("case", "corpus"):
        result = grade(spec, ws, mimic / "private", GradeOptions(text_level=level))
        assert result.score == pytest.approx(1.0), level
        assert result.params["text_level"] == level
        assert all(c.status == "scored" for c in result.cases)
    # the model-based parts are substitutes here, and the result says so
    assert any("CheXbert" in d for d in result.degraded) and any("F1RadGraph" in d for d in result.degraded)


def test_only_findings_are_scored(mimic, tmp_path):
    spec = load_spec("mimic-cxr-report")
    ws = tmp_path / "ws"
    for case in _cases(mimic):
        _write(
            ws,
            case,
            f"INDICATION: cough\n\nFINDINGS: {_ref(mimic, case).strip()}"
            "\n\nIMPRESSION: Unrelated words here.",
        )
    assert grade(spec, ws, mimic / "private").score == pytest.approx(1.0)
    # for a full-report task the same impression would cost points
    full = load_spec("chexpert-plus-cxr")
    assert full.report is not None
    assert full.report.section == "full"


def test_invalid_reports_get_reasons(mimic, tmp_path):
    spec = load_spec("mimic-cxr-report")
    c = _cases(mimic)
    ws = tmp_path / "ws"
    _write(ws, c[0], "Too short.")
    _write(ws, c[1], b"\xff\xfe not utf-8 at all, but long enough to pass the length rule")
    _write(ws, c[2], "The lungs are clear \u2014 there is no pleural effusion or pneumothorax.")
    result = grade(spec, ws, mimic / "private")
    by = {r.case: r for r in result.cases}
    assert by[c[0]].status == "invalid" and "too short" in (by[c[0]].reason or "")
    assert by[c[1]].status == "invalid" and "UTF-8" in (by[c[1]].reason or "")
    assert by[c[2]].status == "invalid" and "non-printable" in (by[c[2]].reason or "")
    assert by[c[3]].status == "missing" and c[3] in (by[c[3]].reason or "")
    assert result.score == 0.0 and result.degraded == []


def test_pathology_captions_accept_unicode_and_short_text(make_twin, tmp_path):
    pathcap = make_twin(*PATHCAP)
    spec = load_spec("pathology-caption-100")
    c = _cases(pathcap)
    ws = tmp_path / "ws"
    _write(ws, c[0], _ref(pathcap, c[0]).strip() + " \u00e9")
    _write(ws, c[1], "Tumour.")
    _write(ws, c[2], "12345")  # no letter at all
    result = grade(spec, ws, pathcap / "private")
    by = {r.case: r for r in result.cases}
    assert by[c[0]].status == "scored" and by[c[0]].score > 0.5
    assert by[c[1]].status == "scored"
    assert by[c[2]].status == "invalid" and "letters" in (by[c[2]].reason or "")


def test_case_and_corpus_levels_with_a_missing_case(mimic, tmp_path):
    spec = load_spec("mimic-cxr-report")
    c = _cases(mimic)
    ws = tmp_path / "ws"
    hyps = [
        "The heart size is normal. There is no pleural effusion or pneumothorax. The lungs are clear.",
        "Small left pleural effusion. The cardiac silhouette is enlarged. No pneumothorax is seen.",
        "An endotracheal tube is in place. There is patchy consolidation. No acute osseous abnormality.",
    ]
    for case, h in zip(c, hyps, strict=False):
        _write(ws, case, h)
    private = mimic / "private"
    by_case = grade(spec, ws, private, GradeOptions(text_level="case"))
    by_corpus = grade(spec, ws, private, GradeOptions(text_level="corpus"))
    refs = [text.scored_text(_ref(mimic, case), "findings") for case in c[:3]]
    expected_case = text.report_score(hyps, refs, level="case")
    expected_corpus = text.report_score(hyps, refs, level="corpus")
    # the missing fourth case counts as 0 under the default gate, at both levels
    assert by_case.score == pytest.approx(expected_case.score * 3 / 4)
    assert by_corpus.score == pytest.approx(expected_corpus.score * 3 / 4)
    assert by_case.score != pytest.approx(by_corpus.score)
    assert set(by_corpus.checks["components"]) == set(text.COMPONENTS)
    gated = grade(spec, ws, private, GradeOptions(completeness="all_or_nothing", text_level="corpus"))
    assert gated.score == 0.0 and gated.checks["gate_applied"]


def test_hostile_files(mimic, tmp_path):
    spec = load_spec("mimic-cxr-report")
    c = _cases(mimic)
    ws = tmp_path / "ws"
    (ws / "agent_outputs" / c[0] / "report.txt").mkdir(parents=True)
    (ws / "agent_outputs" / c[1]).mkdir(parents=True)
    (ws / "agent_outputs" / c[1] / "report.txt").symlink_to("/dev/zero")
    _write(ws, c[2], "word " * 100000)  # far over the 8000-character limit
    (ws / "agent_outputs" / c[3]).parent.mkdir(parents=True, exist_ok=True)
    (ws / "agent_outputs" / c[3]).write_text("a file where a folder should be")
    result = grade(spec, ws, mimic / "private")
    assert [r.status for r in result.cases] == ["invalid", "invalid", "invalid", "missing"]
    assert all(r.reason for r in result.cases)


report_text = st.one_of(
    st.binary(max_size=400),
    st.text(max_size=400),
    st.text(alphabet=st.characters(codec="ascii"), min_size=30, max_size=600),
    st.lists(
        st.sampled_from(
            [
                "FINDINGS:",
                "IMPRESSION:",
                "No",
                "pleural",
                "effusion",
                ".",
                "heart",
                "\n",
                "pneumothorax",
                "|||",
                "possible",
                "enlarged",
                "\x00",
                "tube",
            ]
        ),
        min_size=5,
        max_size=80,
    ).map(" ".join),
    st.just(None),
    st.just("DIR"),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    contents=st.lists(report_text, min_size=4, max_size=4),
    level=st.sampled_from(["case", "corpus"]),
    gate=st.sampled_from(["per_case_zero", "all_or_nothing", "times_completion"]),
    task=st.sampled_from(["mimic-cxr-report", "pathology-caption-100"]),
)
def test_malformed_reports_never_crash(mimic, make_twin, tmp_path, contents, level, gate, task):
    # the caption task allows any Unicode, so control characters and "|||" reach METEOR there
    twin = mimic if task == "mimic-cxr-report" else make_twin(*PATHCAP)
    spec = load_spec(task)
    ws = fresh_dir(tmp_path / "hyp-ws")
    for case, content in zip(_cases(twin), contents, strict=False):
        _write(ws, case, content)
    result = grade(spec, ws, twin / "private", GradeOptions(text_level=level, completeness=gate))
    assert 0.0 <= result.score <= 1.0
    assert len(result.cases) == len(_cases(twin))
    for result_case in result.cases:
        assert 0.0 <= result_case.score <= 1.0
        if result_case.status != "scored":
            assert result_case.score == 0.0 and result_case.reason
    assert json.dumps(msgspec.to_builtins(result))  # as `amb grade --json` prints it
