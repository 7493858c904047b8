"""VQA answer matching: normalisation, strict yes/no, exact match, token F1, A–E labels, placeholders.

Every expected value is worked out by hand from the rules in scorer/metrics/vqa.py's docstring.
"""

from __future__ import annotations

import pytest

from scorer.metrics import vqa as m


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("  Yes. ", "yes"),
        ("TRUE", "yes"),
        ("present", "yes"),
        ("Negative!", "no"),
        ("n", "no"),
        ("Left  Lung,", "left lung"),
        ("two", "2"),
        ("None", "0"),  # "none" is a number word when it is not a whole yes/no answer
        ("single lesion", "1 lesion"),
        ("IVC", "inferior vena cava"),
        ("r kidney", "right kidney"),
        ("clavicle", "clavicle"),  # abbreviations are per token: the "la" inside is untouched
        ("x-ray", "xray"),
        ("CT/MRI", "ctmri"),
        ("", ""),
        (None, ""),
        (42, "42"),
    ],
)
def test_normalize_answer(raw, normal):
    assert m.normalize_answer(raw) == normal


def test_yes_no_synonym_only_as_whole_answer():
    # "positive" alone is yes; inside a longer answer it stays a word.
    assert m.normalize_answer("positive") == "yes"
    assert m.normalize_answer("positive margin") == "positive margin"


def test_exact_match_and_empty_answers():
    assert m.exact_match("The Liver.", "liver") == 0.0  # "the liver" != "liver": no article stripping
    assert m.exact_match("LIVER", "liver.") == 1.0
    assert m.exact_match("three", "3") == 1.0
    assert m.exact_match("", "") == 0.0  # an empty answer never matches, even an empty gold


def test_token_f1_hand_computed():
    # pred "left lower lobe" vs gold "lower lobe": overlap 2, P = 2/3, R = 1 -> F1 = 0.8
    assert m.token_f1("left lower lobe", "lower lobe") == pytest.approx(0.8)
    # repeated tokens are clipped: pred "lobe lobe" vs gold "lobe": overlap 1, P = 1/2, R = 1
    assert m.token_f1("lobe lobe", "lobe") == pytest.approx(2 / 3)
    assert m.token_f1("kidney", "liver") == 0.0
    assert m.token_f1("", "liver") == 0.0


def test_yes_no_is_strict_in_both_modes():
    for mode in ("exact", "em_f1"):
        assert m.open_case_score("yes", ["yes"], mode) == 1.0
        assert m.open_case_score("Yeah", ["yes"], mode) == 1.0
        # a longer answer that starts with "yes" earns nothing, not even token-F1 credit
        assert m.open_case_score("yes, the cyst wall is thick", ["yes"], mode) == 0.0
        assert m.open_case_score("no", ["yes"], mode) == 0.0


def test_open_matching_modes():
    # exact: 0/1; em_f1: 0.5*EM + 0.5*F1 with EM 0, F1 0.8 -> 0.4
    assert m.open_case_score("left lower lobe", ["lower lobe"], "exact") == 0.0
    assert m.open_case_score("left lower lobe", ["lower lobe"], "em_f1") == pytest.approx(0.4)
    assert m.open_case_score("lower lobe", ["lower lobe"], "em_f1") == 1.0
    # the best gold alternative wins
    assert m.open_case_score("rll", ["right lower lobe", "rll"], "exact") == 1.0
    with pytest.raises(ValueError):
        m.open_case_score("a", ["a"], "fuzzy")


@pytest.mark.parametrize(
    ("value", "label"),
    [
        ("C", "C"),
        (" b ", "B"),
        ("(d)", "D"),
        ("Answer: E", "E"),
        ("The answer is A.", "A"),
        ("F", None),
        ("", None),
        (None, None),
        (True, None),
        ("ABC", None),
        (3, None),
    ],
)
def test_normalize_label(value, label):
    assert m.normalize_label(value) == label


def test_choice_score():
    assert m.choice_score("b", "B") == 1.0
    assert m.choice_score("C", "B") == 0.0
    assert m.choice_score("", "B") == 0.0
    assert m.choice_score("Z", "Z") == 0.0  # not a valid label even when it "matches"


@pytest.mark.parametrize(
    ("raw", "answer", "rule"),
    [
        ("", "", None),  # honest skip
        ("The lesion is in the liver.", "liver", None),
        ("", "liver", "raw_empty_with_answer"),
        ("   ", "yes", "raw_empty_with_answer"),
        ("Unknown", "liver", "raw_generic"),
        ("N/A", "", "raw_generic"),
        ("fallback: guessed yes", "yes", "raw_prefix_fallback"),
        ("MOCK: x", "x", "raw_prefix_mock"),
        ("stub:", "", "raw_prefix_stub"),
        (None, "liver", "raw_empty_with_answer"),
        (123, None, None),  # a non-string raw output counts as empty; nothing claimed either
    ],
)
def test_detect_placeholder(raw, answer, rule):
    assert m.detect_placeholder(raw, answer) == rule
