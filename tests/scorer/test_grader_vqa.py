"""The VQA grader on real synthetic twins: hand-built submissions with known scores, the grade options,
and a property test that throws malformed answer files at it."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scorer.grader import grade
from scorer.grader.options import GradeOptions
from tasks import synth
from tasks.registry import load_spec
from tests.scorer.helpers import fresh_dir, place


@pytest.fixture(scope="module")
def open_twin(make_twin) -> Path:
    return make_twin("vqa-rad", 6, 3)


MEDFRAMEQA = ("medframeqa", 4, 3)
"""make_twin's arguments for the multiple-choice twin."""


def _gold(root: Path, qid: str) -> dict:
    return json.loads((root / "private" / qid / "answer.json").read_text())


def _qids(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "private").iterdir() if p.is_dir())


def _write(ws: Path, qid: str, content: dict | str | bytes | None) -> None:
    place(ws / qid / "answer.json", json.dumps(content) if isinstance(content, dict) else content)


def _answer(qid: str, answer: str, label: object = "", raw: str | None = None) -> dict:
    return {
        "question_id": qid,
        "predicted_label": label,
        "predicted_answer": answer,
        "raw_model_output": f"Model says: {answer}" if raw is None else raw,
        "model_name": "test-model",
        "runtime_s": 0.5,
    }


def test_mixed_open_submission_hand_scored(open_twin, tmp_path):
    spec = load_spec("vqa-rad")
    qids = _qids(open_twin)
    golds = {q: _gold(open_twin, q) for q in qids}
    ws = tmp_path / "ws"
    # q0: correct after normalisation (upper case, punctuation); q1: wrong; q2: bad JSON;
    # q3: placeholder; q4: missing; q5: correct
    _write(ws, qids[0], _answer(qids[0], golds[qids[0]]["answer_text"].upper() + "."))
    _write(ws, qids[1], _answer(qids[1], "spleen"))
    _write(ws, qids[2], "{not json")
    _write(ws, qids[3], _answer(qids[3], golds[qids[3]]["answer_text"], raw="fallback: guessed"))
    _write(ws, qids[5], _answer(qids[5], golds[qids[5]]["answer_text"]))
    result = grade(spec, ws, open_twin / "private")
    by = {c.case: c for c in result.cases}
    assert by[qids[0]].score == 1.0 and by[qids[0]].status == "scored"
    assert by[qids[1]].score == 0.0 and by[qids[1]].status == "scored"
    assert by[qids[2]].status == "invalid" and "bad JSON" in (by[qids[2]].reason or "")
    assert by[qids[3]].status == "invalid" and "placeholder" in (by[qids[3]].reason or "")
    assert by[qids[4]].status == "missing" and qids[4] in (by[qids[4]].reason or "")
    assert by[qids[5]].score == 1.0
    assert result.score == pytest.approx(2 / 6)
    assert result.checks["n_correct"] == 2 and result.checks["n_invalid"] == 2
    gated = grade(spec, ws, open_twin / "private", GradeOptions(completeness="all_or_nothing"))
    assert gated.score == 0.0


def test_em_f1_gives_partial_credit_but_not_on_yes_no(open_twin, tmp_path):
    spec = load_spec("vqa-rad")
    ws = tmp_path / "ws"
    qids = _qids(open_twin)
    for q in qids:
        gold = _gold(open_twin, q)["answer_text"]
        _write(ws, q, _answer(q, f"{gold} region"))  # one extra token on every answer
    exact = grade(spec, ws, open_twin / "private", GradeOptions(vqa_matching="exact"))
    mixed = grade(spec, ws, open_twin / "private", GradeOptions(vqa_matching="em_f1"))
    assert exact.score == 0.0
    for case in mixed.cases:
        gold = _gold(open_twin, case.case)
        if gold["answer_type"] == "yes/no":
            assert case.score == 0.0  # "yes region" is not "yes"
        else:
            n = len(gold["answer_text"].replace("-", "").split())
            f1 = 2 * (n / (n + 1)) * 1 / (n / (n + 1) + 1)
            assert case.score == pytest.approx(0.5 * f1), (gold, case)
    assert mixed.params["vqa_matching"] == "em_f1"


def test_perfect_and_honest_skip(open_twin, tmp_path):
    spec = load_spec("vqa-rad")
    ws = tmp_path / "ws"
    synth.perfect_submission(spec, open_twin, ws)
    assert grade(spec, ws, open_twin / "private").score == 1.0
    q = _qids(open_twin)[0]
    _write(ws, q, _answer(q, "", raw=""))
    case = next(c for c in grade(spec, ws, open_twin / "private").cases if c.case == q)
    assert case.score == 0.0 and case.status == "scored" and "honest skip" in (case.reason or "")


def test_warnings_do_not_change_the_score(open_twin, tmp_path):
    spec = load_spec("vqa-rad")
    q = _qids(open_twin)[0]
    ws = tmp_path / "ws"
    _write(
        ws,
        q,
        {
            "question_id": "other",
            "predicted_answer": _gold(open_twin, q)["answer_text"],
            "raw_model_output": "real output",
        },
    )
    case = next(c for c in grade(spec, ws, open_twin / "private").cases if c.case == q)
    assert case.score == 1.0
    assert "missing keys" in (case.reason or "") and "does not match" in (case.reason or "")


def test_multiple_choice_labels(make_twin, tmp_path):
    mc_twin = make_twin(*MEDFRAMEQA)
    spec = load_spec("medframeqa")
    qids = _qids(mc_twin)
    ws = tmp_path / "ws"
    gold0 = _gold(mc_twin, qids[0])
    wrong = next(x for x in "ABCDE" if x != _gold(mc_twin, qids[1])["answer_label"])
    _write(ws, qids[0], _answer(qids[0], gold0["answer_text"], label=f"Answer: {gold0['answer_label']}"))
    _write(ws, qids[1], _answer(qids[1], "x", label=wrong))
    _write(ws, qids[2], _answer(qids[2], "x", label="G"))
    _write(ws, qids[3], _answer(qids[3], "x", label=7))
    result = grade(spec, ws, mc_twin / "private")
    by = {c.case: c for c in result.cases}
    assert by[qids[0]].score == 1.0
    assert by[qids[1]].score == 0.0 and by[qids[1]].status == "scored"
    assert by[qids[2]].status == "invalid" and "not one of A-E" in (by[qids[2]].reason or "")
    assert by[qids[3]].status == "invalid"
    assert result.score == pytest.approx(1 / 4)


def test_a_multiple_choice_label_that_is_not_a_string_is_invalid(make_twin, tmp_path):
    mc_twin = make_twin(*MEDFRAMEQA)
    spec = load_spec("medframeqa")
    qids = _qids(mc_twin)
    ws = tmp_path / "ws"
    # The list and the object hold the question's right letter: read as text, they would match.
    labels = {
        "list": lambda g: [g],
        "dict": lambda g: {"label": g},
        "int": lambda g: 3,
        "null": lambda g: None,
    }
    for q, label in zip(qids, labels.values(), strict=True):
        _write(ws, q, _answer(q, "x", label=label(_gold(mc_twin, q)["answer_label"])))
    result = grade(spec, ws, mc_twin / "private")
    assert [(c.status, c.reason) for c in result.cases] == [
        ("invalid", f"{q}/answer.json: predicted_label must be a string, got {kind}")
        for q, kind in zip(qids, labels, strict=True)
    ]
    assert result.score == 0.0


def test_hostile_files(open_twin, tmp_path):
    spec = load_spec("vqa-rad")
    qids = _qids(open_twin)
    ws = tmp_path / "ws"
    (ws / qids[0] / "answer.json").mkdir(parents=True)  # a directory where the file should be
    _write(ws, qids[1], b"\xff\xfe\x00garbage")
    _write(ws, qids[2], b" " * (2 << 20))  # over the size cap
    _write(ws, qids[3], "[" * 100000 + "]" * 100000)  # deep nesting
    (ws / qids[4]).mkdir()
    (ws / qids[4] / "answer.json").symlink_to("/dev/zero")
    _write(ws, qids[5], {"predicted_answer": ["yes"], "raw_model_output": "x"})
    result = grade(spec, ws, open_twin / "private")
    assert all(c.status == "invalid" and c.reason for c in result.cases), [
        (c.case, c.reason) for c in result.cases
    ]
    assert result.score == 0.0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
answer_like = st.fixed_dictionaries(
    {},
    optional={
        "question_id": json_values,
        "predicted_label": json_values | st.sampled_from(list("ABCDEabcde")),
        "predicted_answer": json_values | st.sampled_from(["yes", "no", "liver", "", "2"]),
        "raw_model_output": json_values | st.sampled_from(["", "unknown", "mock: x", "real"]),
        "model_name": json_values,
        "runtime_s": json_values,
    },
)
file_content = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v)),
    answer_like.map(lambda v: json.dumps(v)),
    st.text(max_size=200),
    st.just(None),  # no file
    st.just("DIR"),  # a directory in the file's place
    st.just("PARENT_FILE"),  # a file where the question's folder should be
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    contents=st.lists(file_content, min_size=6, max_size=6),
    task=st.sampled_from(["vqa-rad", "medframeqa"]),
    matching=st.sampled_from(["exact", "em_f1"]),
)
def test_malformed_submissions_never_crash(open_twin, make_twin, tmp_path, contents, task, matching):
    twin = open_twin if task == "vqa-rad" else make_twin(*MEDFRAMEQA)
    spec = load_spec(task)
    ws = fresh_dir(tmp_path / "hyp-ws")
    for qid, content in zip(_qids(twin), contents, strict=False):
        if content == "PARENT_FILE":
            (ws / qid).write_text("not a folder")
        else:
            _write(ws, qid, content)
    result = grade(spec, ws, twin / "private", GradeOptions(vqa_matching=matching))
    assert 0.0 <= result.score <= 1.0
    assert len(result.cases) == len(_qids(twin))
    for case in result.cases:
        assert 0.0 <= case.score <= 1.0
        if case.status != "scored":
            assert case.score == 0.0 and case.reason
    assert json.dumps(msgspec.to_builtins(result))  # the JSON result (`amb grade --json`) always encodes
