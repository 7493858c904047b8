"""Clause splitting and negation / uncertainty cues for the rule-based report labellers.

Shared by the CheXpert-style labeller and the RadGraph substitute (``chexpert_rules``,
``radgraph_proxy``), which stand in for CheXbert and RadGraph when their weights are absent. The
rules are NegEx-like and deliberately small: a mention is *negated* when a negation cue precedes it
in the same clause or a post-negation phrase follows it there, and *uncertain* likewise with hedge
cues. Clauses end at sentence punctuation and at contrast words ("but", "however", ...), so
"no effusion but a small pneumothorax" negates only the effusion.
"""

from __future__ import annotations

import re
from typing import Literal

Certainty = Literal["present", "absent", "uncertain"]

_SENTENCE = re.compile(r"[.;:!?\n]+")
_CONTRAST = re.compile(r"\b(?:but|however|although|though|otherwise|whereas|except)\b")

_PRE_NEG = re.compile(
    r"\b(?:no|not|without|negative for|free of|clear of|absence of|absent|resolved|resolution of"
    r"|removal of|rather than|never)\b"
)
_POST_NEG = re.compile(
    r"^[^.]{0,40}?\b(?:is|are|has|have|was|were)\s+(?:now\s+)?(?:absent|resolved|gone|removed"
    r"|not (?:seen|identified|present|visualized|evident))\b"
)
_PRE_UNC = re.compile(
    r"\b(?:may|might|could|possible|possibly|probable|probably|likely|suggests?|suggestive of"
    r"|suggesting|concern(?:ing)? for|questionable|question of|suspicious for|suspected|versus|vs"
    r"|differential|presumed|borderline|cannot exclude|can ?not be excluded|not excluded|rule out)\b"
)
_POST_UNC = re.compile(
    r"^[^.]{0,40}?\b(?:cannot be (?:excluded|ruled out)|not (?:be )?excluded|is "
    r"(?:possible|likely|suspected))\b"
)


def clauses(text: str) -> list[str]:
    """Lower-cased clauses of a report (sentence pieces split again at contrast words)."""
    pieces = (" ".join(p.split()) for s in _SENTENCE.split(text.lower()) for p in _CONTRAST.split(s))
    return [p for p in pieces if p]


def certainty(clause: str, start: int, end: int) -> Certainty:
    """The certainty of the mention at ``clause[start:end]`` (negation wins over hedging)."""
    before, after = clause[:start], clause[end:]
    if _PRE_NEG.search(before) or _POST_NEG.search(after):
        return "absent"
    if _PRE_UNC.search(before) or _POST_UNC.search(after):
        return "uncertain"
    return "present"
