"""VQA answer matching: the benchmark's normalisation, exact match, token F1, A–E labels, placeholders.

Pure functions of strings (no files, no JSON): the grader (``scorer.grader.vqa``) parses the answer
files and calls these. The rules follow AutoMedBench's public VQA scorer, so a score here means the
same thing as there; docs/vqa-and-report.md lists them.
"""

from __future__ import annotations

import re
import string
from collections import Counter

VALID_LABELS: tuple[str, ...] = ("A", "B", "C", "D", "E")

YES_NO: dict[str, str] = {
    **dict.fromkeys(("yes", "y", "yeah", "yep", "true", "present", "positive"), "yes"),
    **dict.fromkeys(("no", "n", "nope", "false", "absent", "negative"), "no"),
}

_NUMERALS = "zero one two three four five six seven eight nine ten eleven twelve".split()
NUMBER_WORDS: dict[str, str] = {**{w: str(n) for n, w in enumerate(_NUMERALS)}, "none": "0", "single": "1"}

ABBREVIATIONS: dict[str, str] = {
    # direction: standalone tokens only (the per-token mapping guarantees that)
    "r": "right",
    "l": "left",
    "bil": "bilateral",
    "bilat": "bilateral",
    # cardiovascular structures
    "ivc": "inferior vena cava",
    "svc": "superior vena cava",
    "lv": "left ventricle",
    "rv": "right ventricle",
    "la": "left atrium",
    "ra": "right atrium",
    "lad": "left anterior descending",
    "mca": "middle cerebral artery",
    "ica": "internal carotid artery",
    "pca": "posterior cerebral artery",
    "aca": "anterior cerebral artery",
    # common radiology terms
    "pe": "pulmonary embolism",
    "dvt": "deep vein thrombosis",
    "chf": "congestive heart failure",
    "cad": "coronary artery disease",
    "gi": "gastrointestinal",
    "gu": "genitourinary",
    "cns": "central nervous system",
}

PLACEHOLDER_PREFIXES: tuple[str, ...] = (
    "heuristic:",
    "fallback:",
    "placeholder:",
    "mock:",
    "dummy:",
    "stub:",
)
PLACEHOLDER_WHOLE: frozenset[str] = frozenset({"unknown", "n/a", "na", "none", "null"})

_PUNCT = str.maketrans("", "", string.punctuation)
_WS = re.compile(r"\s+")
_LABEL_TOKEN = re.compile(r"\b([A-E])\b")


def normalize_answer(text: object) -> str:
    """The benchmark's normal form of a free-text answer (see the module docstring)."""
    s = "" if text is None else str(text)
    s = _WS.sub(" ", s.lower().translate(_PUNCT)).strip()
    if s in YES_NO:
        return YES_NO[s]
    tokens = [NUMBER_WORDS.get(t, t) for t in s.split()]
    return " ".join(ABBREVIATIONS.get(t, t) for t in tokens)


def is_yes_no(text: object) -> bool:
    """True when ``text`` normalises to ``yes`` or ``no``."""
    return normalize_answer(text) in ("yes", "no")


def exact_match(pred: object, gold: object) -> float:
    """1.0 when both normalise to the same non-empty string, else 0.0."""
    p, g = normalize_answer(pred), normalize_answer(gold)
    return 1.0 if p and g and p == g else 0.0


def token_f1(pred: object, gold: object) -> float:
    """Bag-of-tokens F1 of the normalised answers (SQuAD style); 0.0 when either is empty."""
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return 0.0
    overlap = sum((Counter(p) & Counter(g)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(p), overlap / len(g)
    return 2 * precision * recall / (precision + recall)


def yes_no_accuracy(pred: object, gold: object) -> float:
    """Strict yes/no: 1.0 iff the gold is yes/no and the prediction normalises to exactly it."""
    g = normalize_answer(gold)
    if g not in ("yes", "no"):
        return 0.0
    return 1.0 if normalize_answer(pred) == g else 0.0


def open_case_score(pred: object, gold_alternatives: list[str], matching: str = "exact") -> float:
    """Score of one open-ended answer against its acceptable gold strings (best alternative wins);
    a yes/no gold (the first alternative) is always scored strictly."""
    if matching not in ("exact", "em_f1"):
        raise ValueError(f"unknown VQA matching {matching!r} (expected exact or em_f1)")
    golds = [g for g in gold_alternatives if normalize_answer(g)] or [""]
    if is_yes_no(golds[0]):
        return yes_no_accuracy(pred, golds[0])
    if matching == "exact":
        return max(exact_match(pred, g) for g in golds)
    em = max(exact_match(pred, g) for g in golds)
    f1 = max(token_f1(pred, g) for g in golds)
    return 0.5 * em + 0.5 * f1


def normalize_label(value: object) -> str | None:
    """An A–E label from a label field: the bare letter, else the first standalone A–E token."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip().upper()
    if text in VALID_LABELS:
        return text
    m = _LABEL_TOKEN.search(text)
    return m.group(1) if m else None


def choice_score(pred_label: object, gold_label: object) -> float:
    """Multiple choice: 1.0 iff the normalised predicted label equals the gold label."""
    p, g = normalize_label(pred_label), normalize_label(gold_label)
    return 1.0 if p is not None and p == g else 0.0


def detect_placeholder(raw_model_output: object, predicted_answer: object) -> str | None:
    """The placeholder rule that fires (``raw_empty_with_answer``, ``raw_generic``,
    ``raw_prefix_<name>``), or None. An honest skip (both empty) is not a placeholder."""
    raw = raw_model_output.strip() if isinstance(raw_model_output, str) else ""
    answer = predicted_answer.strip() if isinstance(predicted_answer, str) else ""
    if not raw and not answer:
        return None
    if not raw:
        return "raw_empty_with_answer"
    low = raw.lower()
    if low in PLACEHOLDER_WHOLE:
        return "raw_generic"
    return next((f"raw_prefix_{p.rstrip(':')}" for p in PLACEHOLDER_PREFIXES if low.startswith(p)), None)
