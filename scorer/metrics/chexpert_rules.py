"""A rule-based CheXpert-style labeller: the documented substitute for CheXbert.

The report score's last three parts are CheXbert's micro precision, recall and F1 over the 14
CheXpert observations. When CheXbert's weights are absent the grader labels both texts with these
rules instead and says so (``degraded``). As in the CheXpert labeller: a finding's mention is
positive, negative or uncertain (cues in its clause); a finding is 1 when any mention is positive
**or uncertain** (the report-generation evaluation maps "uncertain" to 1, as f1chexbert's ``rrg``
mode does); ``No Finding`` is 1 when no finding other than ``Support Devices`` is.

Micro P/R/F1 pool the counts over all (report, label) pairs, like scikit-learn's "micro avg". When
neither side has any positive label, P = R = F1 = 1 (the reports agree); with ``No Finding`` that
never happens on real reports.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from scorer.metrics.negation import certainty, clauses

CHEXPERT_LABELS: tuple[str, ...] = (
    *("Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion", "Edema"),
    *("Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion"),
    *("Pleural Other", "Fracture", "Support Devices", "No Finding"),
)

_PHRASES: dict[str, list[str]] = {
    "Enlarged Cardiomediastinum": [
        r"(?:enlarged|widened|widening of the|prominent) (?:cardio)?mediastin\w*",
        r"mediastinal (?:widening|enlargement)",
        r"cardiomediastinal (?:silhouette|contours?) (?:is|are) enlarged",
    ],
    "Cardiomegaly": [
        r"cardiomegaly",
        r"(?:enlarged|enlargement of the) (?:heart|cardiac silhouette)",
        r"cardiac enlargement",
        r"heart (?:size )?is (?:mildly |moderately |markedly |severely )?enlarged",
        r"cardiac silhouette is (?:mildly |moderately |markedly )?enlarged",
    ],
    "Lung Opacity": [
        r"opacit(?:y|ies)",
        r"opacification",
        r"infiltrates?",
        r"airspace disease",
        r"(?:interstitial|reticular) markings",
        r"haziness",
        r"densit(?:y|ies)",
    ],
    "Lung Lesion": [r"nodules?", r"mass(?:es)?", r"lesions?", r"granulomas?", r"neoplasm", r"tumou?r"],
    "Edema": [
        r"edema",
        r"vascular congestion",
        r"fluid overload",
        r"(?:pulmonary )?venous (?:hypertension|congestion)",
    ],
    "Consolidation": [r"consolidations?", r"consolidative"],
    "Pneumonia": [r"pneumonias?", r"infectious process", r"infection"],
    "Atelectasis": [r"atelectas[ie]s", r"atelectatic", r"collapse"],
    "Pneumothorax": [r"pneumothora(?:x|ces)"],
    "Pleural Effusion": [
        r"(?:pleural )?effusions?",
        r"fluid in the (?:pleural|fissure)",
        r"blunting of the (?:\w+ )?costophrenic",
    ],
    "Pleural Other": [r"pleural thickening", r"fibrothorax", r"pleural (?:scarring|plaques?)"],
    "Fracture": [r"fractures?", r"fractured"],
    "Support Devices": [
        r"(?:endotracheal|et|nasogastric|ng|feeding|chest|enteric) tubes?",
        r"(?:central venous |picc |venous )?(?:line|catheter)s?",
        r"pacemaker",
        r"pacer",
        r"icd",
        r"(?:sternotomy )?wires",
        r"surgical clips",
        r"stents?",
        r"port-?a-?cath",
        r"swan-?ganz",
        r"drains?",
        r"prosthe(?:sis|tic)",
        r"hardware",
    ],
}
_COMPILED = {label: re.compile(r"\b(?:" + "|".join(phrases) + r")\b") for label, phrases in _PHRASES.items()}


def label_report(text: str) -> dict[str, int]:
    """The 14 binary CheXpert labels of one report (1 = positive or uncertain)."""
    labels = dict.fromkeys(CHEXPERT_LABELS, 0)
    for clause in clauses(text):
        for label, pattern in _COMPILED.items():
            if labels[label]:
                continue
            for m in pattern.finditer(clause):
                if certainty(clause, m.start(), m.end()) != "absent":
                    labels[label] = 1
                    break
    findings = [lab for lab in CHEXPERT_LABELS if lab not in ("No Finding", "Support Devices")]
    labels["No Finding"] = 0 if any(labels[lab] for lab in findings) else 1
    return labels


class MicroPRF(msgspec.Struct, frozen=True):
    precision: float
    recall: float
    f1: float
    tp: int
    fp: int
    fn: int


def micro_prf(hyp_labels: Sequence[dict[str, int]], ref_labels: Sequence[dict[str, int]]) -> MicroPRF:
    """Micro-averaged P/R/F1 over all (report, label) pairs."""
    tp = fp = fn = 0
    for h, r in zip(hyp_labels, ref_labels, strict=True):
        for lab in CHEXPERT_LABELS:
            hv, rv = bool(h.get(lab, 0)), bool(r.get(lab, 0))
            tp += hv and rv
            fp += hv and not rv
            fn += rv and not hv
    if tp == fp == fn == 0:
        return MicroPRF(1.0, 1.0, 1.0, 0, 0, 0)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return MicroPRF(precision, recall, f1, tp, fp, fn)
